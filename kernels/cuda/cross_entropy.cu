// CUDA core of the fused cross-entropy: per-row online (max, sum exp) over this rank's vocab shard in one pass,
// and the backward (softmax - onehot) * grad. One block per row.
#include "mtm/cuda_common.cuh"
#include "mtm/gpu.h"

namespace mtm {
namespace gpu {
namespace {

constexpr int kThreads = 512;
static_assert(kThreads % kWarpSize == 0, "block reductions need whole warps");

template <typename T>
__global__ void stats_kernel(CrossEntropyStatsArgs a) {
  __shared__ float red[kMaxWarps];
  const int64_t r = blockIdx.x, v = a.vocab;
  const T* l = static_cast<const T*>(a.logits) + r * v;
  float m = -INFINITY, s = 0.f;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
    const float x = to_f(l[j]);
    if (x > m) {
      s = s * __expf(m - x) + 1.f;
      m = x;
    } else {
      s += __expf(x - m);
    }
  }
  const float gm = block_max(m, red);
  s = m == -INFINITY ? 0.f : s * __expf(m - gm);
  s = block_sum(s, red);
  if (threadIdx.x == 0) {
    static_cast<float*>(a.max)[r] = gm;
    static_cast<float*>(a.sumexp)[r] = s;
    const int64_t t = a.target[r] - a.vocab_start;
    static_cast<float*>(a.target_logit)[r] = (t >= 0 && t < v) ? to_f(l[t]) : 0.f;
  }
}

template <typename T>
__global__ void bwd_kernel(CrossEntropyBwdArgs a) {
  const int64_t r = blockIdx.x, v = a.vocab;
  const T* l = static_cast<const T*>(a.logits) + r * v;
  T* o = static_cast<T*>(a.grad_logits) + r * v;
  const bool ignored = a.target[r] == a.ignore_index;
  const float g = ignored ? 0.f : static_cast<const float*>(a.grad_loss)[r];
  const float lse = static_cast<const float*>(a.lse)[r];
  const int64_t t = ignored ? -1 : a.target[r] - a.vocab_start;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
    float p = g * __expf(to_f(l[j]) - lse);
    if (j == t) p -= g;
    o[j] = from_f<T>(p);
  }
}

}  // namespace

void cross_entropy_stats(const CrossEntropyStatsArgs& a, cudaStream_t s) {
  MTM_GPU_DISPATCH(a.dtype, "cross_entropy", (stats_kernel<scalar_t><<<a.rows, kThreads, 0, s>>>(a)));
  check_launch("cross_entropy");
}
void cross_entropy_bwd(const CrossEntropyBwdArgs& a, cudaStream_t s) {
  MTM_GPU_DISPATCH(a.dtype, "cross_entropy_backward", (bwd_kernel<scalar_t><<<a.rows, kThreads, 0, s>>>(a)));
  check_launch("cross_entropy_backward");
}

}  // namespace gpu
}  // namespace mtm
