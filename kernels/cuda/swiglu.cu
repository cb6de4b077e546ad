// CUDA core of swiglu on x = cat([gate, up]): elementwise, grid-stride, fp32 math.
#include "mtm/cuda_common.cuh"
#include "mtm/gpu.h"

namespace mtm {
namespace gpu {
namespace {

template <typename T>
__global__ void fwd_kernel(SwigluArgs a) {
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.out);
  const int64_t n = a.cols, total = a.rows * n;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = k / n, i = k - r * n;
    const float g = to_f(x[r * 2 * n + i]), u = to_f(x[r * 2 * n + n + i]);
    y[k] = from_f<T>(g / (1.f + __expf(-g)) * u);
  }
}

template <typename T>
__global__ void bwd_kernel(SwigluArgs a) {
  const T* x = static_cast<const T*>(a.x);
  const T* gy = static_cast<const T*>(a.grad_y);
  T* gx = static_cast<T*>(a.out);
  const int64_t n = a.cols, total = a.rows * n;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = k / n, i = k - r * n;
    const float g = to_f(x[r * 2 * n + i]), u = to_f(x[r * 2 * n + n + i]), d = to_f(gy[k]);
    const float s = 1.f / (1.f + __expf(-g));
    gx[r * 2 * n + i] = from_f<T>(d * u * s * (1.f + g * (1.f - s)));
    gx[r * 2 * n + n + i] = from_f<T>(d * g * s);
  }
}

}  // namespace

void swiglu_fwd(const SwigluArgs& a, cudaStream_t s) {
  MTM_GPU_DISPATCH(a.dtype, "swiglu", (fwd_kernel<scalar_t><<<grid_for(a.rows * a.cols, 256), 256, 0, s>>>(a)));
  check_launch("swiglu");
}
void swiglu_bwd(const SwigluArgs& a, cudaStream_t s) {
  MTM_GPU_DISPATCH(a.dtype, "swiglu_backward",
                   (bwd_kernel<scalar_t><<<grid_for(a.rows * a.cols, 256), 256, 0, s>>>(a)));
  check_launch("swiglu_backward");
}

}  // namespace gpu
}  // namespace mtm
