// CUDA core of the DeepSeek-V3 router top-k (sigmoid, expert bias for selection, group-limited, normalised,
// scaled): one thread per token, scores re-read from global memory; experts <= 1024, groups <= 64.
#include "mtm/cuda_common.cuh"
#include "mtm/gpu.h"

namespace mtm {
namespace gpu {
namespace {

constexpr int kMaxExperts = 1024, kMaxGroups = 64;

template <typename T>
__device__ __forceinline__ float score(const T* l, int64_t e) {
  const float sg = 1.f / (1.f + __expf(-to_f(l[e])));
  return to_f(from_f<T>(sg));  // rounded to the logits dtype, as megatron does
}

template <typename T>
__global__ void fwd_kernel(RouterArgs a) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= a.tokens) return;
  const int64_t E = a.experts;
  const T* l = static_cast<const T*>(a.logits) + t * E;
  const float* bias = static_cast<const float*>(a.expert_bias);
  unsigned taken[kMaxExperts / 32];
  unsigned allowed[kMaxExperts / 32];
  for (int i = 0; i < kMaxExperts / 32; ++i) { taken[i] = 0u; allowed[i] = 0xffffffffu; }
  auto routing = [&](int64_t e) { return score<T>(l, e) + (bias ? bias[e] : 0.f); };
  const bool grouped = a.group_topk > 0 && a.num_groups > 1;
  if (grouped) {
    const int64_t per = E / a.num_groups, kg = a.topk / a.group_topk;
    float gs[kMaxGroups];
    for (int g = 0; g < a.num_groups; ++g) {
      float sum = 0.f;
      for (int64_t k = 0; k < kg; ++k) {
        int64_t best = -1;
        float bv = 0.f;
        for (int64_t e = g * per; e < (g + 1) * per; ++e) {
          if (taken[e >> 5] & (1u << (e & 31))) continue;
          const float v = routing(e);
          if (best < 0 || v > bv) { best = e; bv = v; }
        }
        taken[best >> 5] |= 1u << (best & 31);
        sum += bv;
      }
      gs[g] = sum;
    }
    for (int i = 0; i < kMaxExperts / 32; ++i) { taken[i] = 0u; allowed[i] = 0u; }
    unsigned long long chosen_groups = 0ull;
    for (int k = 0; k < a.group_topk; ++k) {
      int best = -1;
      for (int g = 0; g < a.num_groups; ++g)
        if (!(chosen_groups & (1ull << g)) && (best < 0 || gs[g] > gs[best])) best = g;
      chosen_groups |= 1ull << best;
      for (int64_t e = best * per; e < (best + 1) * per; ++e) allowed[e >> 5] |= 1u << (e & 31);
    }
  }
  float denom = 0.f;
  bool* map = a.routing_map_out + t * E;
  T* probs = static_cast<T*>(a.probs) + t * E;
  for (int64_t e = 0; e < E; ++e) map[e] = false;
  for (int k = 0; k < a.topk; ++k) {
    int64_t best = -1;
    float bv = 0.f;
    for (int64_t e = 0; e < E; ++e) {
      const unsigned bit = 1u << (e & 31);
      if ((taken[e >> 5] & bit) || !(allowed[e >> 5] & bit)) continue;
      const float v = routing(e);
      if (best < 0 || v > bv) { best = e; bv = v; }
    }
    taken[best >> 5] |= 1u << (best & 31);
    map[best] = true;
    denom += score<T>(l, best);
  }
  const float norm = (a.topk > 1 ? 1.f / (denom + 1e-20f) : 1.f) * float(a.scaling_factor);
  for (int64_t e = 0; e < E; ++e) probs[e] = from_f<T>(map[e] ? score<T>(l, e) * norm : 0.f);
}

template <typename T>
__global__ void bwd_kernel(RouterArgs a) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= a.tokens) return;
  const int64_t E = a.experts;
  const T* l = static_cast<const T*>(a.logits) + t * E;
  const T* g = static_cast<const T*>(a.grad_probs) + t * E;
  const bool* m = a.routing_map + t * E;
  T* o = static_cast<T*>(a.probs) + t * E;
  const float c = float(a.scaling_factor);
  float z = 0.f, gs = 0.f;
  for (int64_t e = 0; e < E; ++e)
    if (m[e]) {
      const float s = score<T>(l, e);
      z += s;
      gs += to_f(g[e]) * s;
    }
  z += 1e-20f;
  for (int64_t e = 0; e < E; ++e) {
    if (!m[e]) { o[e] = from_f<T>(0.f); continue; }
    const float sg = 1.f / (1.f + __expf(-to_f(l[e])));
    const float ds = a.topk > 1 ? c * (to_f(g[e]) / z - gs / (z * z)) : c * to_f(g[e]);
    o[e] = from_f<T>(ds * sg * (1.f - sg));
  }
}

}  // namespace

void router_topk_fwd(const RouterArgs& a, cudaStream_t s) {
  if (a.experts > kMaxExperts || a.num_groups > kMaxGroups)
    throw std::invalid_argument("mtmegatron moe_router_topk (GPU): at most 1024 experts and 64 groups");
  MTM_GPU_DISPATCH(a.dtype, "moe_router_topk", (fwd_kernel<scalar_t><<<grid_for(a.tokens, 128), 128, 0, s>>>(a)));
  check_launch("moe_router_topk");
}
void router_topk_bwd(const RouterArgs& a, cudaStream_t s) {
  MTM_GPU_DISPATCH(a.dtype, "moe_router_topk_backward",
                   (bwd_kernel<scalar_t><<<grid_for(a.tokens, 128), 128, 0, s>>>(a)));
  check_launch("moe_router_topk_backward");
}

}  // namespace gpu
}  // namespace mtm
