// Vector helpers the kernels share: bfloat16 <-> float32 conversions exactly as torch does them,
// and 2^t / e^x of float vectors. AVX-512 (F, DQ, BW, VL: every AVX-512 CPU since Skylake-SP and
// Zen 4) where compiled for it: SGLANG_AVX512 says so, SGLANG_AVX512_BF16 adds AVX512-BF16.
// SGLANG_AVX2 says AVX2 and FMA are there (on AVX-512 CPUs too): 8-lane loads, sums and e^x.

#pragma once

#include <c10/util/BFloat16.h>

#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__) && !defined(SGLANG_PORTABLE_KERNELS)
#include <immintrin.h>
#define SGLANG_AVX512 1
#if defined(__AVX512BF16__)
#define SGLANG_AVX512_BF16 1
#endif
#endif
#if defined(__AVX2__) && defined(__FMA__) && !defined(SGLANG_PORTABLE_KERNELS)
#include <immintrin.h>
#define SGLANG_AVX2 1
#endif

// The instruction set the including kernel was compiled for (its module's isa()).
#if defined(SGLANG_AVX512_BF16)
#define SGLANG_COMPILED_ISA "avx512_bf16"
#elif defined(SGLANG_AVX512)
#define SGLANG_COMPILED_ISA "avx512"
#else
#define SGLANG_COMPILED_ISA "portable"
#endif

namespace vec {

// x rounded to bfloat16 as torch rounds it (to nearest even), as float32: where HF's bfloat16
// tensor passes round.
inline float round_bf16(float x) { return static_cast<float>(c10::BFloat16(x)); }

// 2^f for f in [0, 1) by a polynomial fitted for relative error < 8e-8 (float32's rounding):
// its coefficients, highest degree first (exp2_512<5>, and decode attention's AVX2 exp).
constexpr float kExp2Degree5[6] = {1.8775764619931579e-3f, 8.989340625703335e-3f,
                                   5.582631751894951e-2f,  2.4015361070632935e-1f,
                                   6.931530833244324e-1f,  9.999999403953552e-1f};

#ifdef SGLANG_AVX512
// 16 bfloat16 values (their bits) widened to float32, exactly.
inline __m512 widen16(__m256i bf16_bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16_bits), 16));
}

// x rounded to bfloat16 as torch rounds (to nearest even, NaN to a quiet NaN, subnormals kept;
// vcvtneps2bf16 would flush those): the bfloat16 bits in each lane's upper half.
inline __m512i bf16_bits(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FC00000));
}

// x rounded to bfloat16 (bf16_bits), as float32.
inline __m512 round_bf16(__m512 x) {
  return _mm512_castsi512_ps(_mm512_and_si512(bf16_bits(x), _mm512_set1_epi32(0xFFFF0000)));
}

// x rounded to bfloat16 (bf16_bits), as 16 bfloat16 values.
inline __m256i narrow16(__m512 x) {
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_bits(x), 16));
}

// 2^t = 2^floor(t) 2^f with f = t - floor(t) in [0, 1) (one vreduceps), 2^f by a polynomial
// fitted for relative error (degree 5: < 8e-8, float32's rounding; degree 3: < 8e-5, far below
// bfloat16's 4e-3), 2^floor(t) applied by vscalefps (which floors t itself).
template <int Degree>
inline __m512 exp2_512(__m512 t) {
  static_assert(Degree == 3 || Degree == 5, "fitted degrees: 3 and 5");
  const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p;
  if constexpr (Degree == 5) {
    p = _mm512_set1_ps(kExp2Degree5[0]);
    for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Degree5[i]));
  } else {
    p = _mm512_set1_ps(7.80244991183281e-2f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.260671854019165e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.958335041999817e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.999251961708069e-1f));
  }
  return _mm512_scalef_ps(p, t);
}

// e^x, to float32's rounding.
inline __m512 exp512(__m512 x) {
  return exp2_512<5>(_mm512_mul_ps(x, _mm512_set1_ps(1.4426950408889634f)));
}
#endif

#ifdef SGLANG_AVX2
// All ones in the first min(left, 8) lanes.
inline __m256i lanes_below(int64_t left) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int count = static_cast<int>(left < 8 ? left : 8);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), lane);
}

// The first min(left, 8) floats at src; zeros past them.
inline __m256 load8(const float* src, int64_t left) {
  return left >= 8 ? _mm256_loadu_ps(src) : _mm256_maskload_ps(src, lanes_below(left));
}

inline void store8(float* dst, __m256 v, int64_t left) {
  if (left >= 8) {
    _mm256_storeu_ps(dst, v);
  } else {
    _mm256_maskstore_ps(dst, lanes_below(left), v);
  }
}

inline float sum8(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

inline float max8(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// 2^t for t <= 0: 2^floor(t) 2^f, 2^f by the degree-5 polynomial above (relative error < 8e-8),
// 2^floor(t) put into the exponent bits; t is held at -126 and above (a weight below 2^-126
// counts as 2^-126 against a softmax sum of at least 1, the maximum's own term).
inline __m256 exp2_nonpositive8(__m256 t) {
  t = _mm256_max_ps(t, _mm256_set1_ps(-126.f));
  const __m256 whole = _mm256_floor_ps(t);
  const __m256 f = _mm256_sub_ps(t, whole);
  __m256 p = _mm256_set1_ps(kExp2Degree5[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2Degree5[i]));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(whole), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// e^x for x <= 0 (scores minus their maximum).
inline __m256 exp_nonpositive8(__m256 x) {
  return exp2_nonpositive8(_mm256_mul_ps(x, _mm256_set1_ps(1.4426950408889634f)));
}
#endif

}  // namespace vec
