// Helpers for the CPU kernel cores: bf16 storage, fp32/fp64 accumulation types, a vectorisable exp, OpenMP
// row loops and dtype dispatch. Included only by kernels/cpu/*.cpp, each of which is compiled once per ISA level
// with MTM_CPU_NS naming the namespace, so these inline helpers never mix code built for different ISAs.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "mtm/args.h"

#ifndef MTM_CPU_NS
#error "MTM_CPU_NS must name the ISA namespace (cpu_base, cpu_avx2 or cpu_avx512)"
#endif

namespace mtm {
namespace MTM_CPU_NS {

struct bf16 {
  uint16_t bits;
};

inline float bf16_to_float(bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // round to nearest even
  const uint32_t quiet_nan = (u >> 16) | 0x40u;                     // NaN stays NaN
  const bool is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  return bf16{static_cast<uint16_t>(is_nan ? quiet_nan : rounded)};
}

template <typename T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };
template <typename T> using acc_t = typename AccOf<T>::type;

template <typename T> inline acc_t<T> ld(const T* p, int64_t i) { return static_cast<acc_t<T>>(p[i]); }
template <> inline float ld<bf16>(const bf16* p, int64_t i) { return bf16_to_float(p[i]); }
template <typename T, typename A> inline void st(T* p, int64_t i, A v) { p[i] = static_cast<T>(v); }
template <> inline void st<bf16, float>(bf16* p, int64_t i, float v) { p[i] = float_to_bf16(v); }

// exp(x) for float: Cody-Waite range reduction + degree-7 polynomial; ~1 ulp, branch-free so loops vectorise.
inline float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float log2e = 1.44269504088896341f;
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  float n = (x * log2e + magic) - magic;
  float r = x - n * 0.693145751953125f;
  r = r - n * 1.428606765330187045e-06f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t e = static_cast<int32_t>(n) + 127;
  uint32_t bits = static_cast<uint32_t>(e) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}
inline double fast_exp(double x) { return std::exp(x); }

template <typename A> inline A sigmoid(A x) { return A(1) / (A(1) + fast_exp(-x)); }

// Runs f(begin, end) over [0, n) split into contiguous chunks, in parallel when the work is large enough.
template <typename F>
inline void parallel_chunks(int64_t n, int64_t min_per_thread, const F& f) {
#ifdef _OPENMP
  int threads = omp_get_max_threads();
  if (n >= 2 * min_per_thread && threads > 1 && !omp_in_parallel()) {
    int64_t parts = n / min_per_thread;
    if (parts > threads) parts = threads;
#pragma omp parallel for num_threads(static_cast<int>(parts)) schedule(static)
    for (int64_t p = 0; p < parts; ++p) {
      int64_t b = n * p / parts, e = n * (p + 1) / parts;
      f(b, e);
    }
    return;
  }
#endif
  f(int64_t(0), n);
}

inline int num_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

[[noreturn]] inline void bad_dtype(const char* op) {
  throw std::invalid_argument(std::string("mtmegatron: unsupported dtype for CPU kernel ") + op);
}

}  // namespace MTM_CPU_NS
}  // namespace mtm

// Calls BODY with `scalar_t` bound to the storage type of dt (float, double, bf16).
#define MTM_CPU_DISPATCH(dt, op, ...)                         \
  switch (dt) {                                               \
    case ::mtm::DType::F32: { using scalar_t = float; __VA_ARGS__; break; }  \
    case ::mtm::DType::F64: { using scalar_t = double; __VA_ARGS__; break; } \
    case ::mtm::DType::BF16: { using scalar_t = bf16; __VA_ARGS__; break; }  \
    default: bad_dtype(op);                                   \
  }
