// CPU core of rms_norm (optionally fused with the residual add) and its backward (input and weight gradients).
// One row per task; fp32 (fp64 for double data) accumulation; weight-gradient partials per thread.
#include <vector>
#include "mtm/cpu_common.h"

namespace mtm {
namespace MTM_CPU_NS {
namespace {

template <typename T, typename W>
void fwd(const RmsNormFwdArgs& a) {
  using A = acc_t<T>;
  const T* x = static_cast<const T*>(a.x);
  const T* res = static_cast<const T*>(a.residual);
  const W* w = static_cast<const W*>(a.weight);
  T* y = static_cast<T*>(a.y);
  T* res_out = static_cast<T*>(a.residual_out);
  A* rstd = static_cast<A*>(a.rstd);
  const int64_t n = a.cols;
  parallel_chunks(a.rows, 1, [&](int64_t r0, int64_t r1) {
    std::vector<A> buf(n);
    A* v = buf.data();
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * n;
      A ss = 0;
      if (res) {
        const T* rr = res + r * n;
        T* ro = res_out + r * n;
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < n; ++i) {
          A s = ld(xr, i) + ld(rr, i);
          st(ro, i, s);
          A sr = ld(ro, i);  // normalise the rounded sum, exactly what the unfused path sees
          v[i] = sr;
          ss += sr * sr;
        }
      } else {
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < n; ++i) {
          A s = ld(xr, i);
          v[i] = s;
          ss += s * s;
        }
      }
      A rs = A(1) / std::sqrt(ss / A(n) + A(a.eps));
      rstd[r] = rs;
      T* yr = y + r * n;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) st(yr, i, v[i] * rs * ld(w, i));
    }
  });
}

template <typename T, typename W>
void bwd(const RmsNormBwdArgs& a) {
  using A = acc_t<T>;
  const T* g = static_cast<const T*>(a.grad_y);
  const T* x = static_cast<const T*>(a.x);
  const W* w = static_cast<const W*>(a.weight);
  const A* rstd = static_cast<const A*>(a.rstd);
  const T* gres = static_cast<const T*>(a.grad_residual);
  T* gx = static_cast<T*>(a.grad_x);
  const int64_t n = a.cols;
  const int threads = num_threads();
  std::vector<A> partial(static_cast<size_t>(threads) * n, A(0));
  std::vector<A> wf(n);
  for (int64_t i = 0; i < n; ++i) wf[i] = ld(w, i);
  int64_t min_rows = a.rows / threads > 0 ? a.rows / threads : 1;
  int next = 0;
  parallel_chunks(a.rows, min_rows, [&](int64_t r0, int64_t r1) {
    int slot;
#pragma omp atomic capture
    slot = next++;
    A* gw = partial.data() + static_cast<int64_t>(slot) * n;
    const A* wv = wf.data();
    for (int64_t r = r0; r < r1; ++r) {
      const T* gr = g + r * n;
      const T* xr = x + r * n;
      const A rs = rstd[r];
      A dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < n; ++i) {
        A xh = ld(xr, i) * rs;
        A gi = ld(gr, i);
        gw[i] += gi * xh;
        dot += gi * wv[i] * xh;
      }
      const A c = dot / A(n);
      T* out = gx + r * n;
      if (gres) {
        const T* gq = gres + r * n;
#pragma omp simd
        for (int64_t i = 0; i < n; ++i)
          st(out, i, rs * (ld(gr, i) * wv[i] - ld(xr, i) * rs * c) + ld(gq, i));
      } else {
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) st(out, i, rs * (ld(gr, i) * wv[i] - ld(xr, i) * rs * c));
      }
    }
  });
  W* gwout = static_cast<W*>(a.grad_w_partial);
  for (int64_t i = 0; i < n; ++i) {
    A s = 0;
    for (int t = 0; t < next; ++t) s += partial[static_cast<int64_t>(t) * n + i];
    st(gwout, i, s);
  }
}

template <typename T>
void fwd_w(const RmsNormFwdArgs& a) {
  if (a.wdtype == a.dtype) fwd<T, T>(a);
  else if (a.wdtype == DType::F32) fwd<T, float>(a);
  else bad_dtype("rms_norm weight");
}
template <typename T>
void bwd_w(const RmsNormBwdArgs& a) {
  if (a.wdtype == a.dtype) bwd<T, T>(a);
  else if (a.wdtype == DType::F32) bwd<T, float>(a);
  else bad_dtype("rms_norm weight");
}

}  // namespace

void rms_norm_fwd(const RmsNormFwdArgs& a) { MTM_CPU_DISPATCH(a.dtype, "rms_norm", fwd_w<scalar_t>(a)); }
void rms_norm_bwd(const RmsNormBwdArgs& a) { MTM_CPU_DISPATCH(a.dtype, "rms_norm_backward", bwd_w<scalar_t>(a)); }

}  // namespace MTM_CPU_NS
}  // namespace mtm
