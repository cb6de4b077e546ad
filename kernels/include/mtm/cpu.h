// Entry points of the CPU kernel cores. Each core is compiled once per instruction-set level into its own
// namespace (cpu_base, cpu_avx2, cpu_avx512; see CMakeLists.txt); mtm::cpu::* picks one at run time (kernels/cpu/isa.cpp).
#pragma once
#include "mtm/args.h"

#define MTM_CPU_OPS(X) MTM_KERNEL_OPS(X)

namespace mtm {
#define MTM_DECLARE(name, A) void name(const A&);
namespace cpu_base { MTM_CPU_OPS(MTM_DECLARE) }
namespace cpu_avx2 { MTM_CPU_OPS(MTM_DECLARE) }
namespace cpu_avx512 { MTM_CPU_OPS(MTM_DECLARE) }
namespace cpu {
MTM_CPU_OPS(MTM_DECLARE)
const char* isa();  // "avx512", "avx2" or "base": the variant chosen on this machine
}
#undef MTM_DECLARE
}  // namespace mtm
