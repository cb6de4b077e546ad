// CPU core of swiglu on megatron's fused fc1 output: x = cat([gate, up], -1), y = silu(gate) * up.
// fp32/bf16 run kW-lane vector code (8 or 16 lanes) (mtm/cpu_vec.h); fp64 (gradcheck only) the scalar loop.
#include "mtm/cpu_vec.h"

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
      if constexpr (kVec<T>) {
        const VF one = vset(1.0f), zero = vset(0.0f);
        for (int64_t i = 0; i < n; i += kW) {
          const int64_t k = n - i;
          VF g = vload_part(gate + i, k, 0.0f), u = vload_part(up + i, k, 0.0f);
          vstore_part(yr + i, k, g * u / (one + vexp(zero - g)));
        }
      } else {
        for (int64_t i = 0; i < n; ++i) {
          A g = ld(gate, i);
          st(yr, i, g * sigmoid(g) * ld(up, i));
        }
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
      if constexpr (kVec<T>) {
        const VF one = vset(1.0f), zero = vset(0.0f);
        for (int64_t i = 0; i < n; i += kW) {
          const int64_t k = n - i;
          VF xg = vload_part(gate + i, k, 0.0f), xu = vload_part(up + i, k, 0.0f), gi = vload_part(g + i, k, 0.0f);
          VF s = one / (one + vexp(zero - xg));
          VF gs = gi * s;
          vstore_part(ogate + i, k, gs * xu * vfma(xg, one - s, one));
          vstore_part(oup + i, k, gs * xg);
        }
      } else {
        for (int64_t i = 0; i < n; ++i) {
          A xg = ld(gate, i), xu = ld(up, i), gi = ld(g, i);
          A s = sigmoid(xg);
          A silu = xg * s;
          st(ogate, i, gi * xu * s * (A(1) + xg * (A(1) - s)));
          st(oup, i, gi * silu);
        }
      }
    }
  });
}

}  // namespace

void swiglu_fwd(const SwigluArgs& a) { MTM_CPU_DISPATCH(a.dtype, "swiglu", fwd<scalar_t>(a)); }
void swiglu_bwd(const SwigluArgs& a) { MTM_CPU_DISPATCH(a.dtype, "swiglu_backward", bwd<scalar_t>(a)); }

}  // namespace MTM_CPU_NS
}  // namespace mtm
