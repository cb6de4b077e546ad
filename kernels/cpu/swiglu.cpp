// CPU core of swiglu on megatron's fused fc1 output: x = cat([gate, up], -1), y = silu(gate) * up.
#include "mtm/cpu_common.h"

namespace mtm {
namespace MTM_CPU_NS {
namespace {

template <typename T>
void fwd(const SwigluArgs& a) {
  using A = acc_t<T>;
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.out);
  const int64_t n = a.cols;
  parallel_chunks(a.rows, (1 << 14) / (n + 1) + 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* gate = x + r * 2 * n;
      const T* up = gate + n;
      T* yr = y + r * n;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        A g = ld(gate, i);
        st(yr, i, g * sigmoid(g) * ld(up, i));
      }
    }
  });
}

template <typename T>
void bwd(const SwigluArgs& a) {
  using A = acc_t<T>;
  const T* x = static_cast<const T*>(a.x);
  const T* gy = static_cast<const T*>(a.grad_y);
  T* gx = static_cast<T*>(a.out);
  const int64_t n = a.cols;
  parallel_chunks(a.rows, (1 << 14) / (n + 1) + 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* gate = x + r * 2 * n;
      const T* up = gate + n;
      const T* g = gy + r * n;
      T* ogate = gx + r * 2 * n;
      T* oup = ogate + n;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        A xg = ld(gate, i), xu = ld(up, i), gi = ld(g, i);
        A s = sigmoid(xg);
        A silu = xg * s;
        st(ogate, i, gi * xu * s * (A(1) + xg * (A(1) - s)));
        st(oup, i, gi * silu);
      }
    }
  });
}

}  // namespace

void swiglu_fwd(const SwigluArgs& a) { MTM_CPU_DISPATCH(a.dtype, "swiglu", fwd<scalar_t>(a)); }
void swiglu_bwd(const SwigluArgs& a) { MTM_CPU_DISPATCH(a.dtype, "swiglu_backward", bwd<scalar_t>(a)); }

}  // namespace MTM_CPU_NS
}  // namespace mtm
