// CPU core of megatron's fused softmaxes: scaled_masked_softmax (masked logits filled with -10000 after
// scaling, mask broadcast over heads and optionally over the batch) and scaled_upper_triang_masked_softmax
// (causal: columns past the row get probability 0). Backward: scale * y * (g - sum(g * y)), 0 where masked.
// fp32/bf16 rows run kW-lane vector code (8 or 16 lanes) (mtm/cpu_vec.h) through an fp32 row buffer; fp64 the scalar loops.
#include <vector>
#include "mtm/cpu_vec.h"

namespace mtm {
namespace MTM_CPU_NS {
namespace {

// One row, vector path: v = scaled (masked) logits -> exp(v - max) -> y = v / sum; y[len:] = 0.
template <typename T>
void fwd_row_vec(const T* xr, const bool* mr, T* yr, float* v, int64_t len, int64_t sk, float scale) {
  const VF sc = vset(scale), masked = vset(-10000.0f);
  VF m = vset(-INFINITY);
  for (int64_t j = 0; j < len; j += kW) {
    const int64_t k = len - j;
    VF s = vload_part(xr + j, k, 0.0f) * sc;
    if (mr) s = vselect(vmask_part(mr + j, k), masked, s);
    vstore(v + j, s);
    if (k < kW) s = vselect(vlanes_from(k), vset(-INFINITY), s);  // padding lanes never win the max
    m = vmax(m, s);
  }
  const VF mx = vset(hmax(m));
  VF sum = vset(0.0f);
  for (int64_t j = 0; j < len; j += kW) {
    VF e = vexp(vload(v + j) - mx);
    if (len - j < kW) e = vselect(vlanes_from(len - j), vset(0.0f), e);
    vstore(v + j, e);
    sum = sum + e;
  }
  const VF inv = vset(1.0f / hsum(sum));
  for (int64_t j = 0; j < len; j += kW) vstore_part(yr + j, len - j, vload(v + j) * inv);
  if (len < sk) std::memset(static_cast<void*>(yr + len), 0, sizeof(T) * (sk - len));
}

template <typename T>
void fwd(const SoftmaxArgs& a) {
  using A = acc_t<T>;
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.out);
  const int64_t sk = a.sk, sq = a.sq;
  const A scale = A(a.scale);
  parallel_chunks(a.batches * sq, (1 << 12) / (sk + 1) + 1, [&](int64_t r0, int64_t r1) {
    std::vector<A> buf(sk + kW);
    A* v = buf.data();
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t bh = r / sq, i = r % sq;
      const T* xr = x + r * sk;
      T* yr = y + r * sk;
      const int64_t len = a.causal ? (i + 1 < sk ? i + 1 : sk) : sk;
      const bool* mr = a.mask ? a.mask + (bh / a.heads) * a.mask_batch_stride + i * sk : nullptr;
      if constexpr (kVec<T>) {
        fwd_row_vec(xr, mr, yr, v, len, sk, float(scale));
        continue;
      }
      A m = -INFINITY;
      for (int64_t j = 0; j < len; ++j) {
        A s = (mr && mr[j]) ? A(-10000) : ld(xr, j) * scale;
        v[j] = s;
        m = s > m ? s : m;
      }
      A sum = 0;
      for (int64_t j = 0; j < len; ++j) {
        A e = fast_exp(v[j] - m);
        v[j] = e;
        sum += e;
      }
      const A inv = A(1) / sum;
      for (int64_t j = 0; j < len; ++j) st(yr, j, v[j] * inv);
      for (int64_t j = len; j < sk; ++j) st(yr, j, A(0));
    }
  });
}

template <typename T>
void bwd(const SoftmaxArgs& a) {
  using A = acc_t<T>;
  const T* y = static_cast<const T*>(a.y);
  const T* g = static_cast<const T*>(a.grad_y);
  T* gx = static_cast<T*>(a.out);
  const int64_t sk = a.sk, sq = a.sq;
  const A scale = A(a.scale);
  parallel_chunks(a.batches * sq, (1 << 12) / (sk + 1) + 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t bh = r / sq, i = r % sq;
      const T* yr = y + r * sk;
      const T* gr = g + r * sk;
      T* o = gx + r * sk;
      const int64_t len = a.causal ? (i + 1 < sk ? i + 1 : sk) : sk;
      const bool* mr = a.mask ? a.mask + (bh / a.heads) * a.mask_batch_stride + i * sk : nullptr;
      if constexpr (kVec<T>) {
        VF dotv = vset(0.0f);
        for (int64_t j = 0; j < len; j += kW)
          dotv = vfma(vload_part(gr + j, len - j, 0.0f), vload_part(yr + j, len - j, 0.0f), dotv);
        const VF dot = vset(hsum(dotv)), sc = vset(float(scale)), zero = vset(0.0f);
        for (int64_t j = 0; j < len; j += kW) {
          const int64_t k = len - j;
          VF out = sc * vload_part(yr + j, k, 0.0f) * (vload_part(gr + j, k, 0.0f) - dot);
          if (mr) out = vselect(vmask_part(mr + j, k), zero, out);
          vstore_part(o + j, k, out);
        }
        if (len < sk) std::memset(static_cast<void*>(o + len), 0, sizeof(T) * (sk - len));
        continue;
      }
      A dot = 0;
      for (int64_t j = 0; j < len; ++j) dot += ld(gr, j) * ld(yr, j);
      for (int64_t j = 0; j < len; ++j) st(o, j, (mr && mr[j]) ? A(0) : scale * ld(yr, j) * (ld(gr, j) - dot));
      for (int64_t j = len; j < sk; ++j) st(o, j, A(0));
    }
  });
}

}  // namespace

void softmax_fwd(const SoftmaxArgs& a) { MTM_CPU_DISPATCH(a.dtype, "softmax", fwd<scalar_t>(a)); }
void softmax_bwd(const SoftmaxArgs& a) { MTM_CPU_DISPATCH(a.dtype, "softmax_backward", bwd<scalar_t>(a)); }

}  // namespace MTM_CPU_NS
}  // namespace mtm
