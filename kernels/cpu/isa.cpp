// Run-time choice between the CPU core variants compiled for baseline x86-64 / other CPUs (cpu_base) and for
// AVX2+FMA (cpu_avx2). Built once, without ISA flags.
#include "mtm/cpu.h"

namespace mtm {
namespace cpu {
namespace {
bool use_avx2() {
#if defined(MTM_HAVE_AVX2_VARIANT) && (defined(__x86_64__) || defined(__i386__))
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
#else
  return false;
#endif
}
}  // namespace

const char* isa() { return use_avx2() ? "avx2" : "base"; }

#ifdef MTM_HAVE_AVX2_VARIANT
#define MTM_PICK(name, A) \
  void name(const A& a) { use_avx2() ? cpu_avx2::name(a) : cpu_base::name(a); }
#else
#define MTM_PICK(name, A) \
  void name(const A& a) { cpu_base::name(a); }
#endif
MTM_CPU_OPS(MTM_PICK)
#undef MTM_PICK

}  // namespace cpu
}  // namespace mtm
