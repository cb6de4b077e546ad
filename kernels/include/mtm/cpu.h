// Entry points of the CPU kernel cores. Each core is compiled once per instruction-set level into its own
// namespace (cpu_base, cpu_avx2; see CMakeLists.txt); mtm::cpu::* picks one at run time (kernels/cpu/isa.cpp).
#pragma once
#include "mtm/args.h"

#define MTM_CPU_OPS(X)           \
  X(rms_norm_fwd, RmsNormFwdArgs) \
  X(rms_norm_bwd, RmsNormBwdArgs) \
  X(swiglu_fwd, SwigluArgs)       \
  X(swiglu_bwd, SwigluArgs)       \
  X(rope, RopeArgs)               \
  X(softmax_fwd, SoftmaxArgs)     \
  X(softmax_bwd, SoftmaxArgs)     \
  X(cross_entropy_stats, CrossEntropyStatsArgs) \
  X(cross_entropy_bwd, CrossEntropyBwdArgs)     \
  X(moe_index, MoeIndexArgs)                    \
  X(moe_permute, MoePermuteArgs)                \
  X(moe_unpermute_fwd, MoeUnpermuteArgs)        \
  X(moe_unpermute_bwd, MoeUnpermuteArgs)        \
  X(router_topk_fwd, RouterArgs)                \
  X(router_topk_bwd, RouterArgs)                \
  X(adam_step, AdamArgs)

namespace mtm {
#define MTM_DECLARE(name, A) void name(const A&);
namespace cpu_base { MTM_CPU_OPS(MTM_DECLARE) }
namespace cpu_avx2 { MTM_CPU_OPS(MTM_DECLARE) }
namespace cpu {
MTM_CPU_OPS(MTM_DECLARE)
const char* isa();  // "avx2" or "base": the variant chosen on this machine
}
#undef MTM_DECLARE
}  // namespace mtm
