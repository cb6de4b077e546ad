// CUDA core of MoE permute/unpermute by routing map. moe_index: per-expert counts, an exclusive scan of the
// offsets, then one block per expert scans its token column in order (megatron's row order). Unpermute and the
// backward run one block per token over its row map: deterministic, no atomics.
#include "mtm/cuda_common.cuh"
#include "mtm/gpu.h"

namespace mtm {
namespace gpu {
namespace {

constexpr int kThreads = 256;
static_assert(kThreads % kWarpSize == 0, "block reductions need whole warps");

__global__ void count_kernel(MoeIndexArgs a) {
  __shared__ float red[kMaxWarps];
  const int64_t e = blockIdx.x;
  float c = 0.f;
  for (int64_t t = threadIdx.x; t < a.tokens; t += blockDim.x) c += a.routing_map[t * a.experts + e] ? 1.f : 0.f;
  c = block_sum(c, red);  // exact for counts < 2^24
  if (threadIdx.x == 0) a.expert_offsets[e + 1] = static_cast<int64_t>(c);
}

__global__ void scan_kernel(MoeIndexArgs a) {
  if (threadIdx.x != 0) return;
  a.expert_offsets[0] = 0;
  for (int64_t e = 0; e < a.experts; ++e) a.expert_offsets[e + 1] += a.expert_offsets[e];
}

__global__ void fill_kernel(MoeIndexArgs a) {
  __shared__ int64_t scan[kThreads];
  __shared__ int64_t base;
  const int64_t e = blockIdx.x;
  if (threadIdx.x == 0) base = a.expert_offsets[e];
  __syncthreads();
  for (int64_t t0 = 0; t0 < a.tokens; t0 += blockDim.x) {
    const int64_t t = t0 + threadIdx.x;
    const int flag = (t < a.tokens && a.routing_map[t * a.experts + e]) ? 1 : 0;
    scan[threadIdx.x] = flag;
    __syncthreads();
    for (int off = 1; off < blockDim.x; off <<= 1) {  // inclusive Hillis-Steele scan
      int64_t v = threadIdx.x >= off ? scan[threadIdx.x - off] : 0;
      __syncthreads();
      scan[threadIdx.x] += v;
      __syncthreads();
    }
    if (t < a.tokens) {
      if (flag) {
        const int64_t row = base + scan[threadIdx.x] - 1;
        a.sorted_indices[row] = t;
        a.row_id_map[t * a.experts + e] = static_cast<int32_t>(row);
      } else {
        a.row_id_map[t * a.experts + e] = -1;
      }
    }
    __syncthreads();
    if (threadIdx.x == blockDim.x - 1) base += scan[threadIdx.x];
    __syncthreads();
  }
}

template <typename T>
__global__ void permute_kernel(MoePermuteArgs a) {
  const T* in = static_cast<const T*>(a.tokens);
  T* out = static_cast<T*>(a.out);
  for (int64_t r = blockIdx.x; r < a.num_out; r += gridDim.x) {
    const T* src = in + a.sorted_indices[r] * a.hidden;
    T* dst = out + r * a.hidden;
    for (int64_t i = threadIdx.x; i < a.hidden; i += blockDim.x) dst[i] = src[i];
  }
}

template <typename T>
__global__ void unpermute_kernel(MoeUnpermuteArgs a) {
  const T* in = static_cast<const T*>(a.permuted);
  const float* probs = static_cast<const float*>(a.probs);
  T* out = static_cast<T*>(a.out);
  const int64_t t = blockIdx.x, E = a.experts, h = a.hidden;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    float acc = 0.f;
    for (int64_t e = 0; e < E; ++e) {
      const int32_t r = a.row_id_map[t * E + e];
      if (r >= 0) acc += to_f(in[static_cast<int64_t>(r) * h + i]) * (probs ? probs[t * E + e] : 1.f);
    }
    out[t * h + i] = from_f<T>(acc);
  }
}

template <typename T>
__global__ void unpermute_bwd_kernel(MoeUnpermuteArgs a) {
  __shared__ float red[kMaxWarps];
  const T* perm = static_cast<const T*>(a.permuted);
  const T* go = static_cast<const T*>(a.grad_out);
  const float* probs = static_cast<const float*>(a.probs);
  T* gp = static_cast<T*>(a.out);
  float* gprobs = static_cast<float*>(a.grad_probs);
  const int64_t t = blockIdx.x, E = a.experts, h = a.hidden;
  for (int64_t e = 0; e < E; ++e) {
    const int32_t r = a.row_id_map[t * E + e];
    if (r < 0) {
      if (gprobs && threadIdx.x == 0) gprobs[t * E + e] = 0.f;
      continue;
    }
    const float p = probs ? probs[t * E + e] : 1.f;
    float dot = 0.f;
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
      const float g = to_f(go[t * h + i]);
      dot += g * to_f(perm[static_cast<int64_t>(r) * h + i]);
      gp[static_cast<int64_t>(r) * h + i] = from_f<T>(g * p);
    }
    if (gprobs) {
      dot = block_sum(dot, red);
      if (threadIdx.x == 0) gprobs[t * E + e] = dot;
    }
  }
}

}  // namespace

void moe_index(const MoeIndexArgs& a, cudaStream_t s) {
  count_kernel<<<a.experts, kThreads, 0, s>>>(a);
  scan_kernel<<<1, kWarpSize, 0, s>>>(a);
  fill_kernel<<<a.experts, kThreads, 0, s>>>(a);
  check_launch("moe_permute_index");
}
void moe_permute(const MoePermuteArgs& a, cudaStream_t s) {
  MTM_GPU_DISPATCH(a.dtype, "moe_permute", (permute_kernel<scalar_t><<<grid_for(a.num_out, 1), kThreads, 0, s>>>(a)));
  check_launch("moe_permute");
}
void moe_unpermute_fwd(const MoeUnpermuteArgs& a, cudaStream_t s) {
  MTM_GPU_DISPATCH(a.dtype, "moe_unpermute", (unpermute_kernel<scalar_t><<<a.tokens, kThreads, 0, s>>>(a)));
  check_launch("moe_unpermute");
}
void moe_unpermute_bwd(const MoeUnpermuteArgs& a, cudaStream_t s) {
  MTM_GPU_DISPATCH(a.dtype, "moe_unpermute_backward",
                   (unpermute_bwd_kernel<scalar_t><<<a.tokens, kThreads, 0, s>>>(a)));
  check_launch("moe_unpermute_backward");
}

}  // namespace gpu
}  // namespace mtm
