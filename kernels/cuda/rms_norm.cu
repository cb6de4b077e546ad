// CUDA core of rms_norm (+ fused residual add) and its backward. Forward: one block per row. Backward: a grid
// of num_parts blocks striding over rows; each block owns one fp32 row of weight-gradient partials.
#include "mtm/cuda_common.cuh"
#include "mtm/gpu.h"

namespace mtm {
namespace gpu {
namespace {

constexpr int kThreads = 256;
static_assert(kThreads % kWarpSize == 0, "block reductions need whole warps");

template <typename T, typename W>
__global__ void fwd_kernel(RmsNormFwdArgs a) {
  __shared__ float red[kMaxWarps];
  const int64_t r = blockIdx.x, n = a.cols;
  const T* x = static_cast<const T*>(a.x) + r * n;
  const T* res = a.residual ? static_cast<const T*>(a.residual) + r * n : nullptr;
  T* ro = a.residual_out ? static_cast<T*>(a.residual_out) + r * n : nullptr;
  const W* w = static_cast<const W*>(a.weight);
  T* y = static_cast<T*>(a.y) + r * n;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float v = to_f(x[i]);
    if (res) {
      T s = from_f<T>(v + to_f(res[i]));
      ro[i] = s;
      v = to_f(s);
    }
    ss += v * v;
  }
  ss = block_sum(ss, red);
  const float rs = rsqrtf(ss / float(n) + float(a.eps));
  if (threadIdx.x == 0) static_cast<float*>(a.rstd)[r] = rs;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float v = res ? to_f(ro[i]) : to_f(x[i]);
    y[i] = from_f<T>(v * rs * to_f(w[i]));
  }
}

template <typename T, typename W>
__global__ void bwd_kernel(RmsNormBwdArgs a) {
  __shared__ float red[kMaxWarps];
  const int64_t n = a.cols;
  const W* w = static_cast<const W*>(a.weight);
  float* gw = static_cast<float*>(a.grad_w_partial) + blockIdx.x * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) gw[i] = 0.f;
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const T* g = static_cast<const T*>(a.grad_y) + r * n;
    const T* x = static_cast<const T*>(a.x) + r * n;
    const float rs = static_cast<const float*>(a.rstd)[r];
    float dot = 0.f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      float xh = to_f(x[i]) * rs, gi = to_f(g[i]);
      gw[i] += gi * xh;
      dot += gi * to_f(w[i]) * xh;
    }
    const float c = block_sum(dot, red) / float(n);
    T* gx = static_cast<T*>(a.grad_x) + r * n;
    const T* gres = a.grad_residual ? static_cast<const T*>(a.grad_residual) + r * n : nullptr;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      float v = rs * (to_f(g[i]) * to_f(w[i]) - to_f(x[i]) * rs * c);
      if (gres) v += to_f(gres[i]);
      gx[i] = from_f<T>(v);
    }
  }
}

template <typename T>
void fwd_t(const RmsNormFwdArgs& a, cudaStream_t s) {
  if (a.wdtype == a.dtype) fwd_kernel<T, T><<<a.rows, kThreads, 0, s>>>(a);
  else if (a.wdtype == DType::F32) fwd_kernel<T, float><<<a.rows, kThreads, 0, s>>>(a);
  else bad_dtype("rms_norm weight");
  check_launch("rms_norm");
}
template <typename T>
void bwd_t(const RmsNormBwdArgs& a, cudaStream_t s) {
  const unsigned grid = static_cast<unsigned>(a.num_parts);
  if (a.wdtype == a.dtype) bwd_kernel<T, T><<<grid, kThreads, 0, s>>>(a);
  else if (a.wdtype == DType::F32) bwd_kernel<T, float><<<grid, kThreads, 0, s>>>(a);
  else bad_dtype("rms_norm weight");
  check_launch("rms_norm_backward");
}

}  // namespace

int64_t rms_norm_bwd_num_parts(int64_t rows, int64_t cols) {
  (void)cols;
  return rows < 256 ? (rows > 0 ? rows : 1) : 256;
}
void rms_norm_fwd(const RmsNormFwdArgs& a, cudaStream_t s) { MTM_GPU_DISPATCH(a.dtype, "rms_norm", fwd_t<scalar_t>(a, s)); }
void rms_norm_bwd(const RmsNormBwdArgs& a, cudaStream_t s) {
  MTM_GPU_DISPATCH(a.dtype, "rms_norm_backward", bwd_t<scalar_t>(a, s));
}

}  // namespace gpu
}  // namespace mtm
