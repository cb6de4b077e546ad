// CPU core of megatron's fused softmaxes: scaled_masked_softmax (masked logits filled with -10000 after
// scaling, mask broadcast over heads and optionally over the batch) and scaled_upper_triang_masked_softmax
// (causal: columns past the row get probability 0). Backward: scale * y * (g - sum(g * y)), 0 where masked.
#include <vector>
#include "mtm/cpu_common.h"

namespace mtm {
namespace MTM_CPU_NS {
namespace {

template <typename T>
void fwd(const SoftmaxArgs& a) {
  using A = acc_t<T>;
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.out);
  const int64_t sk = a.sk, sq = a.sq;
  const A scale = A(a.scale);
  parallel_chunks(a.batches * sq, (1 << 12) / (sk + 1) + 1, [&](int64_t r0, int64_t r1) {
    std::vector<A> buf(sk);
    A* v = buf.data();
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t bh = r / sq, i = r % sq;
      const T* xr = x + r * sk;
      T* yr = y + r * sk;
      const int64_t len = a.causal ? (i + 1 < sk ? i + 1 : sk) : sk;
      A m = -INFINITY;
      if (a.mask) {
        const bool* mr = a.mask + (bh / a.heads) * a.mask_batch_stride + i * sk;
#pragma omp simd reduction(max : m)
        for (int64_t j = 0; j < len; ++j) {
          A s = mr[j] ? A(-10000) : ld(xr, j) * scale;
          v[j] = s;
          m = s > m ? s : m;
        }
      } else {
#pragma omp simd reduction(max : m)
        for (int64_t j = 0; j < len; ++j) {
          A s = ld(xr, j) * scale;
          v[j] = s;
          m = s > m ? s : m;
        }
      }
      A sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < len; ++j) {
        A e = fast_exp(v[j] - m);
        v[j] = e;
        sum += e;
      }
      const A inv = A(1) / sum;
#pragma omp simd
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
      A dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < len; ++j) dot += ld(gr, j) * ld(yr, j);
      if (a.mask) {
        const bool* mr = a.mask + (bh / a.heads) * a.mask_batch_stride + i * sk;
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) st(o, j, mr[j] ? A(0) : scale * ld(yr, j) * (ld(gr, j) - dot));
      } else {
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) st(o, j, scale * ld(yr, j) * (ld(gr, j) - dot));
      }
      for (int64_t j = len; j < sk; ++j) st(o, j, A(0));
    }
  });
}

}  // namespace

void softmax_fwd(const SoftmaxArgs& a) { MTM_CPU_DISPATCH(a.dtype, "softmax", fwd<scalar_t>(a)); }
void softmax_bwd(const SoftmaxArgs& a) { MTM_CPU_DISPATCH(a.dtype, "softmax_backward", bwd<scalar_t>(a)); }

}  // namespace MTM_CPU_NS
}  // namespace mtm
