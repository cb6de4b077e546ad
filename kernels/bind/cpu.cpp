// Registers the CPU kernel cores (kernels/cpu, ISA picked at run time) for the CPU dispatch key.
#include "ops.h"
#include "mtm/cpu.h"

namespace {
struct CpuDev {
#define MTM_FWD(name, A) \
  static void name(const mtm::A& a) { mtm::cpu::name(a); }
  MTM_CPU_OPS(MTM_FWD)
#undef MTM_FWD
  // The CPU core reduces the weight gradient itself.
  static int64_t rms_norm_bwd_num_parts(int64_t, int64_t) { return 0; }
};
}  // namespace

TORCH_LIBRARY_IMPL(mtmegatron, CPU, m) { mtm::bind::register_all<CpuDev>(m); }
