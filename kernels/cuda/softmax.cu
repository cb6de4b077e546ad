// CUDA core of megatron's fused softmaxes (padding mask with -10000 fill, or causal): one warp per row, fp32.
#include "mtm/cuda_common.cuh"
#include "mtm/gpu.h"

namespace mtm {
namespace gpu {
namespace {

constexpr int kWarps = 4;

template <typename T>
__global__ void fwd_kernel(SoftmaxArgs a) {
  const int64_t r = blockIdx.x * int64_t(kWarps) + (threadIdx.x / kWarpSize);
  const int lane = threadIdx.x % kWarpSize;
  if (r >= a.batches * a.sq) return;
  const int64_t bh = r / a.sq, i = r - bh * a.sq, sk = a.sk;
  const int64_t len = a.causal ? (i + 1 < sk ? i + 1 : sk) : sk;
  const T* x = static_cast<const T*>(a.x) + r * sk;
  T* y = static_cast<T*>(a.out) + r * sk;
  const bool* m = a.mask ? a.mask + (bh / a.heads) * a.mask_batch_stride + i * sk : nullptr;
  const float scale = float(a.scale);
  float mx = -INFINITY;
  for (int64_t j = lane; j < len; j += kWarpSize) mx = fmaxf(mx, (m && m[j]) ? -10000.f : to_f(x[j]) * scale);
  mx = warp_max(mx);
  float sum = 0.f;
  for (int64_t j = lane; j < len; j += kWarpSize) sum += __expf(((m && m[j]) ? -10000.f : to_f(x[j]) * scale) - mx);
  const float inv = 1.f / warp_sum(sum);
  for (int64_t j = lane; j < sk; j += kWarpSize) {
    float v = j < len ? __expf(((m && m[j]) ? -10000.f : to_f(x[j]) * scale) - mx) * inv : 0.f;
    y[j] = from_f<T>(v);
  }
}

template <typename T>
__global__ void bwd_kernel(SoftmaxArgs a) {
  const int64_t r = blockIdx.x * int64_t(kWarps) + (threadIdx.x / kWarpSize);
  const int lane = threadIdx.x % kWarpSize;
  if (r >= a.batches * a.sq) return;
  const int64_t bh = r / a.sq, i = r - bh * a.sq, sk = a.sk;
  const int64_t len = a.causal ? (i + 1 < sk ? i + 1 : sk) : sk;
  const T* y = static_cast<const T*>(a.y) + r * sk;
  const T* g = static_cast<const T*>(a.grad_y) + r * sk;
  T* gx = static_cast<T*>(a.out) + r * sk;
  const bool* m = a.mask ? a.mask + (bh / a.heads) * a.mask_batch_stride + i * sk : nullptr;
  float dot = 0.f;
  for (int64_t j = lane; j < len; j += kWarpSize) dot += to_f(g[j]) * to_f(y[j]);
  dot = warp_sum(dot);
  const float scale = float(a.scale);
  for (int64_t j = lane; j < sk; j += kWarpSize) {
    float v = (j < len && !(m && m[j])) ? scale * to_f(y[j]) * (to_f(g[j]) - dot) : 0.f;
    gx[j] = from_f<T>(v);
  }
}

}  // namespace

void softmax_fwd(const SoftmaxArgs& a, cudaStream_t s) {
  const unsigned grid = static_cast<unsigned>((a.batches * a.sq + kWarps - 1) / kWarps);
  MTM_GPU_DISPATCH(a.dtype, "softmax", (fwd_kernel<scalar_t><<<grid, kWarpSize * kWarps, 0, s>>>(a)));
  check_launch("softmax");
}
void softmax_bwd(const SoftmaxArgs& a, cudaStream_t s) {
  const unsigned grid = static_cast<unsigned>((a.batches * a.sq + kWarps - 1) / kWarps);
  MTM_GPU_DISPATCH(a.dtype, "softmax_backward", (bwd_kernel<scalar_t><<<grid, kWarpSize * kWarps, 0, s>>>(a)));
  check_launch("softmax_backward");
}

}  // namespace gpu
}  // namespace mtm
