// CPU core of rms_norm (optionally fused with the residual add) and its backward (input and weight gradients).
// One row per task; fp32 (fp64 for double data) accumulation; weight-gradient partials per thread.
// fp32/bf16 rows run kW-lane vector code (8 or 16 lanes) (mtm/cpu_vec.h) with the weight converted to fp32 once per thread.
#include <vector>
#include "mtm/cpu_vec.h"

namespace mtm {
namespace MTM_CPU_NS {
namespace {

template <typename W>
std::vector<float> weight_f32(const W* w, int64_t n) {
  std::vector<float> out(n + kW, 0.0f);
  for (int64_t i = 0; i < n; ++i) out[i] = float(ld(w, i));
  return out;
}

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
    if constexpr (kVec<T>) {
      const std::vector<float> wf = weight_f32(w, n);
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = x + r * n;
        const T* src = xr;
        VF ssv = vset(0.0f);
        if (res) {
          const T* rr = res + r * n;
          T* ro = res_out + r * n;
          for (int64_t i = 0; i < n; i += kW)
            vstore_part(ro + i, n - i, vload_part(xr + i, n - i, 0.0f) + vload_part(rr + i, n - i, 0.0f));
          src = ro;  // normalise the rounded sum, exactly what the unfused path sees
        }
        for (int64_t i = 0; i < n; i += kW) {
          VF s = vload_part(src + i, n - i, 0.0f);
          ssv = vfma(s, s, ssv);
        }
        const float rs = 1.0f / std::sqrt(hsum(ssv) / float(n) + float(a.eps));
        rstd[r] = rs;
        T* yr = y + r * n;
        const VF rsv = vset(rs);
        for (int64_t i = 0; i < n; i += kW)
          vstore_part(yr + i, n - i, vload_part(src + i, n - i, 0.0f) * rsv * vload(wf.data() + i));
      }
    } else {
      std::vector<A> buf(n);
      A* v = buf.data();
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = x + r * n;
        A ss = 0;
        for (int64_t i = 0; i < n; ++i) {
          A s = ld(xr, i);
          if (res) {
            st(res_out + r * n, i, s + ld(res + r * n, i));
            s = ld(res_out + r * n, i);
          }
          v[i] = s;
          ss += s * s;
        }
        A rs = A(1) / std::sqrt(ss / A(n) + A(a.eps));
        rstd[r] = rs;
        T* yr = y + r * n;
        for (int64_t i = 0; i < n; ++i) st(yr, i, v[i] * rs * ld(w, i));
      }
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
  const int64_t n = a.cols, np = n + kW;
  const int threads = num_threads();
  std::vector<A> partial(static_cast<size_t>(threads) * np, A(0));
  std::vector<A> wf(np, A(0));
  for (int64_t i = 0; i < n; ++i) wf[i] = ld(w, i);
  int64_t min_rows = a.rows / threads > 0 ? a.rows / threads : 1;
  int next = 0;
  parallel_chunks(a.rows, min_rows, [&](int64_t r0, int64_t r1) {
    int slot;
#pragma omp atomic capture
    slot = next++;
    A* gw = partial.data() + static_cast<int64_t>(slot) * np;
    const A* wv = wf.data();
    for (int64_t r = r0; r < r1; ++r) {
      const T* gr = g + r * n;
      const T* xr = x + r * n;
      const A rs = rstd[r];
      T* out = gx + r * n;
      const T* gq = gres ? gres + r * n : nullptr;
      if constexpr (kVec<T>) {
        const VF rsv = vset(rs);
        VF dotv = vset(0.0f);
        for (int64_t i = 0; i < n; i += kW) {
          VF xh = vload_part(xr + i, n - i, 0.0f) * rsv, gi = vload_part(gr + i, n - i, 0.0f);
          vstore(gw + i, vfma(gi, xh, vload(gw + i)));
          dotv = vfma(gi * vload(wv + i), xh, dotv);
        }
        const VF c = vset(hsum(dotv) / float(n));
        for (int64_t i = 0; i < n; i += kW) {
          const int64_t k = n - i;
          VF xh = vload_part(xr + i, k, 0.0f) * rsv;
          VF o = rsv * (vload_part(gr + i, k, 0.0f) * vload(wv + i) - xh * c);
          if (gq) o = o + vload_part(gq + i, k, 0.0f);
          vstore_part(out + i, k, o);
        }
      } else {
        A dot = 0;
        for (int64_t i = 0; i < n; ++i) {
          A xh = ld(xr, i) * rs;
          A gi = ld(gr, i);
          gw[i] += gi * xh;
          dot += gi * wv[i] * xh;
        }
        const A c = dot / A(n);
        for (int64_t i = 0; i < n; ++i)
          st(out, i, rs * (ld(gr, i) * wv[i] - ld(xr, i) * rs * c) + (gq ? ld(gq, i) : A(0)));
      }
    }
  });
  W* gwout = static_cast<W*>(a.grad_w_partial);
  for (int64_t i = 0; i < n; ++i) {
    A s = 0;
    for (int t = 0; t < next; ++t) s += partial[static_cast<int64_t>(t) * np + i];
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
