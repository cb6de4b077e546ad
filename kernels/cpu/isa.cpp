// Run-time choice between the CPU core variants compiled for baseline x86-64 / other CPUs (cpu_base), AVX2+FMA
// (cpu_avx2) and AVX-512 F/BW/VL/DQ (cpu_avx512). Built once, without ISA flags. MTMEGATRON_CPU_ISA=base|avx2
// caps the choice (to compare variants, or to sidestep AVX-512 clock throttling on older Xeons).
#include <cstdlib>
#include <cstring>

#include "mtm/cpu.h"

namespace mtm {
namespace cpu {
namespace {
enum Level { kBase = 0, kAvx2 = 1, kAvx512 = 2 };

Level detect() {
#if defined(MTM_HAVE_AVX2_VARIANT) && (defined(__x86_64__) || defined(__i386__))
  Level level = kBase;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) level = kAvx2;
  if (level == kAvx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    level = kAvx512;
  const char* cap = std::getenv("MTMEGATRON_CPU_ISA");
  if (cap && std::strcmp(cap, "base") == 0) level = kBase;
  if (cap && std::strcmp(cap, "avx2") == 0 && level > kAvx2) level = kAvx2;
  return level;
#else
  return kBase;
#endif
}

Level level() {
  static const Level l = detect();
  return l;
}
}  // namespace

const char* isa() { return level() == kAvx512 ? "avx512" : level() == kAvx2 ? "avx2" : "base"; }

#ifdef MTM_HAVE_AVX2_VARIANT
#define MTM_PICK(name, A)                                  \
  void name(const A& a) {                                  \
    switch (level()) {                                     \
      case kAvx512: return cpu_avx512::name(a);            \
      case kAvx2: return cpu_avx2::name(a);                \
      default: return cpu_base::name(a);                   \
    }                                                      \
  }
#else
#define MTM_PICK(name, A) \
  void name(const A& a) { cpu_base::name(a); }
#endif
MTM_CPU_OPS(MTM_PICK)
#undef MTM_PICK

}  // namespace cpu
}  // namespace mtm
