// CUDA core of the multi-tensor fused AdamW step: tensors are cut into 64K-element chunks; each launch carries
// up to kTensors tensors and kChunks chunks in its parameter block (one block per chunk).
#include <cmath>
#include <vector>

#include "mtm/cuda_common.cuh"
#include "mtm/gpu.h"

namespace mtm {
namespace gpu {
namespace {

constexpr int kTensors = 24, kChunks = 192;
constexpr int64_t kChunkSize = 1 << 16;

struct Batch {
  float* p[kTensors];
  const void* g[kTensors];
  float* m[kTensors];
  float* v[kTensors];
  int64_t n[kTensors];
  int tensor[kChunks];
  int64_t start[kChunks];
};

template <typename G>
__global__ void adam_kernel(Batch b, float lr, float b1, float b2, float eps, float wd, float step_size,
                            float inv_bc2_sqrt) {
  const int ti = b.tensor[blockIdx.x];
  const int64_t begin = b.start[blockIdx.x];
  const int64_t end = begin + kChunkSize < b.n[ti] ? begin + kChunkSize : b.n[ti];
  float* p = b.p[ti];
  const G* g = static_cast<const G*>(b.g[ti]);
  float* m = b.m[ti];
  float* v = b.v[ti];
  const float decay = 1.f - lr * wd;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float gi = to_f(g[i]);
    const float mi = b1 * m[i] + (1.f - b1) * gi;
    const float vi = b2 * v[i] + (1.f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (sqrtf(vi) * inv_bc2_sqrt + eps);
  }
}

}  // namespace

void adam_step(const AdamArgs& a, cudaStream_t s) {
  const double bc1 = 1.0 - std::pow(double(a.beta1), double(a.step));
  const double bc2 = 1.0 - std::pow(double(a.beta2), double(a.step));
  const float step_size = static_cast<float>(a.lr / bc1), inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  Batch b{};
  int nt = 0, nc = 0;
  auto flush = [&]() {
    if (nc == 0) return;
    if (a.grad_dtype == DType::BF16)
      adam_kernel<__nv_bfloat16><<<nc, 512, 0, s>>>(b, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, step_size,
                                                    inv_bc2_sqrt);
    else
      adam_kernel<float><<<nc, 512, 0, s>>>(b, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, step_size,
                                            inv_bc2_sqrt);
    check_launch("adam_step");
    nt = 0;
    nc = 0;
  };
  for (int64_t t = 0; t < a.num_tensors; ++t) {
    if (a.numels[t] == 0) continue;
    if (nt == kTensors) flush();
    b.p[nt] = a.params[t];
    b.g[nt] = a.grads[t];
    b.m[nt] = a.exp_avgs[t];
    b.v[nt] = a.exp_avg_sqs[t];
    b.n[nt] = a.numels[t];
    for (int64_t start = 0; start < a.numels[t]; start += kChunkSize) {
      if (nc == kChunks) {  // keep this tensor in the next batch as slot 0
        flush();
        b.p[0] = a.params[t];
        b.g[0] = a.grads[t];
        b.m[0] = a.exp_avgs[t];
        b.v[0] = a.exp_avg_sqs[t];
        b.n[0] = a.numels[t];
        nt = 0;
      }
      b.tensor[nc] = nt;
      b.start[nc] = start;
      ++nc;
    }
    ++nt;
  }
  flush();
}

}  // namespace gpu
}  // namespace mtm
