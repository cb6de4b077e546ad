// A small fixed-width float vector for the CPU kernel cores: kW fp32 lanes (16 with AVX-512, else 8), loaded from and stored to fp32 or
// bf16 memory (bf16 -> fp32 is a shift; fp32 -> bf16 rounds to nearest even and keeps NaN a NaN, bit-identical
// to float_to_bf16 in cpu_common.h), plus the exp of cpu_common.h's fast_exp, sqrt, select and reductions.
// AVX-512 intrinsics in the cpu_avx512 build, AVX2+FMA in cpu_avx2, plain 8-element loops (auto-vectorised
// with SSE2) in cpu_base.
// Kernels loop `for (i = 0; i < n; i += kW)` and pass k = min(kW, n - i) to the *_part load/store for the tail.
#pragma once
#include <type_traits>

#include "mtm/cpu_common.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define MTM_VEC_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MTM_VEC_AVX2 1
#endif

namespace mtm {
namespace MTM_CPU_NS {

#ifdef MTM_VEC_AVX512
constexpr int kW = 16;
#else
constexpr int kW = 8;
#endif

#if defined(MTM_VEC_AVX512)
struct VF {
  __m512 v;
};
inline VF vset(float x) { return {_mm512_set1_ps(x)}; }
inline VF operator+(VF a, VF b) { return {_mm512_add_ps(a.v, b.v)}; }
inline VF operator-(VF a, VF b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline VF operator*(VF a, VF b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline VF operator/(VF a, VF b) { return {_mm512_div_ps(a.v, b.v)}; }
inline VF vfma(VF a, VF b, VF c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline VF vmax(VF a, VF b) { return {_mm512_max_ps(a.v, b.v)}; }
inline VF vmin(VF a, VF b) { return {_mm512_min_ps(a.v, b.v)}; }
inline VF vsqrt(VF a) { return {_mm512_sqrt_ps(a.v)}; }
inline float hsum(VF a) { return _mm512_reduce_add_ps(a.v); }
inline float hmax(VF a) { return _mm512_reduce_max_ps(a.v); }
inline VF vload(const float* p) { return {_mm512_loadu_ps(p)}; }
inline VF vload(const bf16* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
}
inline void vstore(float* p, VF a) { _mm512_storeu_ps(p, a.v); }
inline void vstore(bf16* p, VF a) {
  const __m512i u = _mm512_castps_si512(a.v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __m512i qnan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q), r, qnan);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
struct VM {
  __mmask16 m;
};
inline VM vmask(const bool* p) {
  __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm_test_epi8_mask(b, b)};
}
inline VF vselect(VM m, VF a, VF b) { return {_mm512_mask_blend_ps(m.m, b.v, a.v)}; }
inline VM vlanes_from(int64_t k) { return {static_cast<__mmask16>(0xffffu << k)}; }
inline VF vexp(VF x) {
  x = vmin(vmax(x, vset(-87.0f)), vset(88.0f));
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x.v, _mm512_set1_ps(1.44269504088896341f), magic), magic);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x.v);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return {_mm512_mul_ps(p, _mm512_castsi512_ps(e))};
}
#elif defined(MTM_VEC_AVX2)
struct VF {
  __m256 v;
};
inline VF vset(float x) { return {_mm256_set1_ps(x)}; }
inline VF operator+(VF a, VF b) { return {_mm256_add_ps(a.v, b.v)}; }
inline VF operator-(VF a, VF b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline VF operator*(VF a, VF b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline VF operator/(VF a, VF b) { return {_mm256_div_ps(a.v, b.v)}; }
inline VF vfma(VF a, VF b, VF c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }  // a * b + c
inline VF vmax(VF a, VF b) { return {_mm256_max_ps(a.v, b.v)}; }
inline VF vmin(VF a, VF b) { return {_mm256_min_ps(a.v, b.v)}; }
inline VF vsqrt(VF a) { return {_mm256_sqrt_ps(a.v)}; }
inline float hsum(VF a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float hmax(VF a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline VF vload(const float* p) { return {_mm256_loadu_ps(p)}; }
inline VF vload(const bf16* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))};
}
inline void vstore(float* p, VF a) { _mm256_storeu_ps(p, a.v); }
inline void vstore(bf16* p, VF a) {
  const __m256i u = _mm256_castps_si256(a.v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  r = _mm256_blendv_epi8(r, qnan, _mm256_castps_si256(_mm256_cmp_ps(a.v, a.v, _CMP_UNORD_Q)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}
// Lane mask from kW bools (true lanes all-ones); vselect(m, a, b) = m ? a : b.
struct VM {
  __m256 m;
};
inline VM vmask(const bool* p) {
  __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  __m256i w = _mm256_cvtepu8_epi32(b);
  return {_mm256_castsi256_ps(_mm256_cmpgt_epi32(w, _mm256_setzero_si256()))};
}
inline VF vselect(VM m, VF a, VF b) { return {_mm256_blendv_ps(b.v, a.v, m.m)}; }
// Lanes l >= k set (the padding lanes of a tail of k elements).
inline VM vlanes_from(int64_t k) {
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return {_mm256_castsi256_ps(_mm256_cmpgt_epi32(iota, _mm256_set1_epi32(static_cast<int>(k) - 1)))};
}
inline VF vexp(VF x) {
  x = vmin(vmax(x, vset(-87.0f)), vset(88.0f));
  const __m256 magic = _mm256_set1_ps(12582912.0f);
  __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x.v, _mm256_set1_ps(1.44269504088896341f), magic), magic);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x.v);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return {_mm256_mul_ps(p, _mm256_castsi256_ps(e))};
}
#else
struct VF {
  float v[kW];
};
#define MTM_VF_LANES(expr) \
  VF o;                    \
  for (int l = 0; l < kW; ++l) o.v[l] = (expr); \
  return o
inline VF vset(float x) { MTM_VF_LANES(x); }
inline VF operator+(VF a, VF b) { MTM_VF_LANES(a.v[l] + b.v[l]); }
inline VF operator-(VF a, VF b) { MTM_VF_LANES(a.v[l] - b.v[l]); }
inline VF operator*(VF a, VF b) { MTM_VF_LANES(a.v[l] * b.v[l]); }
inline VF operator/(VF a, VF b) { MTM_VF_LANES(a.v[l] / b.v[l]); }
inline VF vfma(VF a, VF b, VF c) { MTM_VF_LANES(a.v[l] * b.v[l] + c.v[l]); }
inline VF vmax(VF a, VF b) { MTM_VF_LANES(a.v[l] > b.v[l] ? a.v[l] : b.v[l]); }
inline VF vmin(VF a, VF b) { MTM_VF_LANES(a.v[l] < b.v[l] ? a.v[l] : b.v[l]); }
inline VF vsqrt(VF a) { MTM_VF_LANES(std::sqrt(a.v[l])); }
inline VF vexp(VF a) { MTM_VF_LANES(fast_exp(a.v[l])); }
inline VF vload(const float* p) { MTM_VF_LANES(p[l]); }
inline VF vload(const bf16* p) { MTM_VF_LANES(bf16_to_float(p[l])); }
#undef MTM_VF_LANES
inline float hsum(VF a) {
  float s = 0;
  for (int l = 0; l < kW; ++l) s += a.v[l];
  return s;
}
inline float hmax(VF a) {
  float s = a.v[0];
  for (int l = 1; l < kW; ++l) s = a.v[l] > s ? a.v[l] : s;
  return s;
}
inline void vstore(float* p, VF a) {
  for (int l = 0; l < kW; ++l) p[l] = a.v[l];
}
inline void vstore(bf16* p, VF a) {
  for (int l = 0; l < kW; ++l) p[l] = float_to_bf16(a.v[l]);
}
struct VM {
  bool m[kW];
};
inline VM vmask(const bool* p) {
  VM o;
  for (int l = 0; l < kW; ++l) o.m[l] = p[l];
  return o;
}
inline VM vlanes_from(int64_t k) {
  VM o;
  for (int l = 0; l < kW; ++l) o.m[l] = l >= k;
  return o;
}
inline VF vselect(VM m, VF a, VF b) {
  VF o;
  for (int l = 0; l < kW; ++l) o.v[l] = m.m[l] ? a.v[l] : b.v[l];
  return o;
}
#endif

// Partial (tail) loads/stores of k < kW lanes through a stack buffer; missing lanes read as `fill`.
template <typename T>
inline VF vload_part(const T* p, int64_t k, float fill) {
  if (k >= kW) return vload(p);
  float buf[kW];
  for (int l = 0; l < kW; ++l) buf[l] = l < k ? ld(p, l) : fill;
  return vload(static_cast<const float*>(buf));
}
template <typename T>
inline void vstore_part(T* p, int64_t k, VF a) {
  if (k >= kW) return vstore(p, a);
  float buf[kW];
  vstore(buf, a);
  for (int64_t l = 0; l < k; ++l) st(p, l, buf[l]);
}
inline VM vmask_part(const bool* p, int64_t k) {
  if (k >= kW) return vmask(p);
  bool buf[kW] = {};
  for (int64_t l = 0; l < k; ++l) buf[l] = p[l];
  return vmask(buf);
}

// True for the storage types the VF kernels handle (fp32, bf16); fp64 keeps the scalar loops.
template <typename T> constexpr bool kVec = !std::is_same<T, double>::value;

}  // namespace MTM_CPU_NS
}  // namespace mtm
