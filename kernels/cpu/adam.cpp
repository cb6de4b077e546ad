// CPU core of the multi-tensor fused AdamW step for fp32 master parameters (torch.optim.AdamW semantics:
// decoupled weight decay, bias correction). Work is split into fixed-size chunks across all tensors.
#include <vector>
#include "mtm/cpu_vec.h"

namespace mtm {
namespace MTM_CPU_NS {
namespace {

template <typename G>
void chunk(const AdamArgs& a, int64_t ti, int64_t b, int64_t e, float step_size, float inv_bc2_sqrt) {
  float* p = a.params[ti];
  const G* g = static_cast<const G*>(a.grads[ti]);
  float* m = a.exp_avgs[ti];
  float* v = a.exp_avg_sqs[ti];
  const float b1 = a.beta1, b2 = a.beta2, decay = 1.0f - a.lr * a.weight_decay, eps = a.eps;
  // One pass per element: read p, g, m, v once, write p, m, v once (kW lanes at a time).
  const VF vb1 = vset(b1), vb2 = vset(b2), vc1 = vset(1.0f - b1), vc2 = vset(1.0f - b2), vdecay = vset(decay),
           vstep = vset(-step_size), vinv = vset(inv_bc2_sqrt), veps = vset(eps);
  int64_t i = b;
  for (; i + kW <= e; i += kW) {
    VF gi = vload(g + i);
    VF mi = vfma(vb1, vload(m + i), vc1 * gi);
    VF vi = vfma(vb2, vload(v + i), vc2 * gi * gi);
    vstore(m + i, mi);
    vstore(v + i, vi);
    vstore(p + i, vfma(vstep, mi / vfma(vsqrt(vi), vinv, veps), vload(p + i) * vdecay));
  }
  for (; i < e; ++i) {
    float gi = ld(g, i);
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) * inv_bc2_sqrt + eps);
  }
}

}  // namespace

void adam_step(const AdamArgs& a) {
  const int64_t kChunk = 1 << 16;
  std::vector<int64_t> tensor_of, start_of;
  for (int64_t t = 0; t < a.num_tensors; ++t)
    for (int64_t b = 0; b < a.numels[t]; b += kChunk) {
      tensor_of.push_back(t);
      start_of.push_back(b);
    }
  const double bc1 = 1.0 - std::pow(double(a.beta1), double(a.step));
  const double bc2 = 1.0 - std::pow(double(a.beta2), double(a.step));
  const float step_size = static_cast<float>(a.lr / bc1);
  const float inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  const int64_t n = static_cast<int64_t>(tensor_of.size());
  parallel_chunks(n, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t t = tensor_of[c], b = start_of[c];
      const int64_t e = b + kChunk < a.numels[t] ? b + kChunk : a.numels[t];
      if (a.grad_dtype == DType::BF16) chunk<bf16>(a, t, b, e, step_size, inv_bc2_sqrt);
      else chunk<float>(a, t, b, e, step_size, inv_bc2_sqrt);
    }
  });
}

}  // namespace MTM_CPU_NS
}  // namespace mtm
