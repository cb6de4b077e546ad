// Device helpers for the CUDA kernel cores: fp32 load/store of float/bf16/half, warp and block reductions,
// launch-error checks and dtype dispatch. CUDA runtime headers only (no torch), so nvcc can compile every .cu
// against kernels/include alone.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "mtm/args.h"

// Lanes per warp, fixed at compile time: 32 on NVIDIA. The MUSA port (musa_port.py) gets it from the build
// (-DMTM_WARP_SIZE, derived from the target arch by musa_build.py: 128 on mp_21/mp_22, 32 on mp_31).
// Kernels use kWarpSize / kMaxWarps / kFullMask below, never a literal 32, 31, 5 or 0xffffffff.
#ifndef MTM_WARP_SIZE
#define MTM_WARP_SIZE 32
#endif

namespace mtm {
namespace gpu {

constexpr int kWarpSize = MTM_WARP_SIZE;
static_assert(kWarpSize == 32 || kWarpSize == 64 || kWarpSize == 128, "MTM_WARP_SIZE must be 32, 64 or 128");
// Shared slots a block reduction needs: one per warp of the largest block (1024 threads).
constexpr int kMaxWarps = 1024 / kWarpSize;
// Shuffle participation mask for a whole warp. The mask argument is 32 bits wide; with 32 lanes all-ones is
// every lane, and MUSA's 128-lane targets take the same all-ones value to mean the whole warp (as torch_musa's
// WARP_SHFL_XOR default does).
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half(v); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o, kWarpSize);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o, kWarpSize));
  return v;
}

// Sum over the block; every thread gets the result. `shared` needs kMaxWarps floats; blockDim.x a multiple of
// kWarpSize (the whole last warp takes part in the shuffles).
__device__ __forceinline__ float block_sum(float v, float* shared) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize, warps = blockDim.x / kWarpSize;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0.0f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize, warps = blockDim.x / kWarpSize;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(v);
}

inline void check_launch(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string("mtmegatron CUDA kernel ") + what + ": " +
                                                   cudaGetErrorString(err));
}

inline unsigned grid_for(int64_t n, int threads, int64_t cap = 65535) {
  int64_t g = (n + threads - 1) / threads;
  if (g < 1) g = 1;
  return static_cast<unsigned>(g < cap ? g : cap);
}

[[noreturn]] inline void bad_dtype(const char* op) {
  throw std::invalid_argument(std::string("mtmegatron: unsupported dtype for GPU kernel ") + op +
                              " (float32, bfloat16, float16)");
}

}  // namespace gpu
}  // namespace mtm

#define MTM_GPU_DISPATCH(dt, op, ...)                                                \
  switch (dt) {                                                                      \
    case ::mtm::DType::F32: { using scalar_t = float; __VA_ARGS__; break; }          \
    case ::mtm::DType::BF16: { using scalar_t = __nv_bfloat16; __VA_ARGS__; break; } \
    case ::mtm::DType::F16: { using scalar_t = __half; __VA_ARGS__; break; }         \
    default: ::mtm::gpu::bad_dtype(op);                                              \
  }
