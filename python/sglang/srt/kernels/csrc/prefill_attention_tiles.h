// Tiles of the prefill attention kernel (prefill_attention.cpp): the packed K/V block layouts,
// their packing, the micro-kernels that compute a tile of scores (Q.K^T) and accumulate a tile
// of P.V, and the online-softmax step between them (with a vector exp). One layout per storage
// and ISA:
// - FloatLayout: float32 blocks, K as [dim][kKeys] and V as [kKeys][dim]; AVX-512 micro-kernels
//   where present (SGLANG_AVX512, vector_math.h), else AVX2 ones (SGLANG_TILES_AVX2: 16 ymm
//   registers hold R rows x 16 keys or dims of accumulators), portable loops elsewhere.
// - PairLayout (bfloat16 with AVX512-BF16): K as [dim/2][kKeys][2] and V as [kKeys/2][dim][2],
//   pairs for vdpbf16ps (16 key scores, or 16 output dims, per instruction).
// Micro-kernels take R query rows (R <= kRowTile) at once; scores and P rows are kKeys apart.

#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "vector_math.h"

namespace prefill_tiles {

#ifdef SGLANG_AVX512
using vec::exp2_512;
using vec::widen16;
#elif defined(SGLANG_AVX2)
#define SGLANG_TILES_AVX2 1
#endif

constexpr int64_t kKeys = 128;    // keys per packed block (one online-softmax step)
constexpr int64_t kKeyTile = 64;  // keys per score micro-kernel call (4 vectors of 16)...
constexpr int64_t kTailTile = 32;  // ...or 2 at a block's end, where at most 32 keys are left
constexpr int kRowTile = 4;       // query rows per micro-kernel call
constexpr int kDimTile = 4;       // 16-wide output vectors per P.V micro-kernel call
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Keys of a block of n that the micro-kernels read: whole kTailTile tiles (packing zero-pads n
// up to there and leaves the rest of the block unwritten).
inline int64_t packed_keys(int64_t n) {
  return std::min(kKeys, (n + kTailTile - 1) / kTailTile * kTailTile);
}

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) { return static_cast<float>(x); }

// dst[0, n) = src[0, n) in dst's type (a plain copy where the types agree).
template <typename T, typename Elem>
inline void copy_row(const T* src, int64_t n, Elem* dst) {
  if constexpr (std::is_same_v<T, Elem>) {
    std::memcpy(dst, src, n * sizeof(T));
  } else {
    for (int64_t d = 0; d < n; ++d) dst[d] = Elem(to_float(src[d]));
  }
}

#ifdef SGLANG_AVX512
// Whether 16 floats store to T in one instruction: float, and bfloat16 where the CPU rounds to it.
template <typename T>
constexpr bool kStores16 = std::is_same_v<T, float>
#ifdef SGLANG_AVX512_BF16
                           || std::is_same_v<T, c10::BFloat16>
#endif
    ;

// dst[0, 16) = x rounded to T (kStores16<T>).
template <typename T>
inline void store16(T* dst, __m512 x) {
  static_assert(kStores16<T>, "no vector store to this type on this CPU");
  if constexpr (std::is_same_v<T, float>) {
    _mm512_storeu_ps(dst, x);
  } else {
#ifdef SGLANG_AVX512_BF16
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), (__m256i)_mm512_cvtneps_pbh(x));
#endif
  }
}
#endif

// dst[0, n) = acc[0, n) * scale rounded to T.
template <typename T>
inline void store_scaled(const float* acc, float scale, int64_t n, T* dst) {
  int64_t d = 0;
#ifdef SGLANG_AVX512
  if constexpr (kStores16<T>)
    for (; d + 16 <= n; d += 16)
      store16(dst + d, _mm512_mul_ps(_mm512_loadu_ps(acc + d), _mm512_set1_ps(scale)));
#elif defined(SGLANG_TILES_AVX2)
  if constexpr (std::is_same_v<T, float>)
    for (; d + 8 <= n; d += 8)
      _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_loadu_ps(acc + d), _mm256_set1_ps(scale)));
#endif
  for (; d < n; ++d) dst[d] = static_cast<T>(acc[d] * scale);
}

#ifdef SGLANG_AVX512
// Keeps a loaded vector in a register: without this the compiler folds the load into each FMA
// that uses it, one load per FMA, and the float32 micro-kernels become load-bound.
inline void in_register(__m512& x) { asm("" : "+v"(x)); }
#elif defined(SGLANG_TILES_AVX2)
inline void in_register(__m256& x) { asm("" : "+x"(x)); }
#endif

// Tells the compiler that a micro-kernel's loop runs at least once (head dims are multiples of
// 16, P.V takes at least one key pair): without it GCC keeps the accumulators of the
// zero-trip case in stack slots, zeroed before the loop and copied after it, which costs a
// score micro-kernel over a head dim of 80 a sixth of its time.
inline void assume_some(int64_t count) {
  if (count < 1) __builtin_unreachable();
}

// ---- float32 blocks: K [dim][kKeys], V [kKeys][dim] ----
struct FloatLayout {
  using Elem = float;
  static constexpr int64_t kKeyStep = 1;  // P.V consumes keys one at a time

  template <typename T>
  static void pack_k(const T* const* keys, int64_t n, int64_t dim, float* dst) {
    for (int64_t d = 0; d < dim; ++d) {  // dims outer: the loads of all keys overlap
      for (int64_t j = 0; j < n; ++j) dst[d * kKeys + j] = to_float(keys[j][d]);
      std::fill(dst + d * kKeys + n, dst + d * kKeys + packed_keys(n), 0.f);
    }
  }
  template <typename T>
  static void pack_v(const T* const* values, int64_t n, int64_t dim, float* dst) {
    for (int64_t j = 0; j < n; ++j) copy_row(values[j], dim, dst + j * dim);
    std::fill(dst + n * dim, dst + packed_keys(n) * dim, 0.f);
  }

  // scores[r][h + j] = q[r] . k[h + j] for rows [0, R) and the 16 NK keys from h on
  template <int R, int NK>
  static void qk(const float* q, const float* k, int64_t dim, int64_t h, float* scores) {
    assume_some(dim);
#ifdef SGLANG_AVX512
    __m512 acc[R][NK];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NK; ++v) acc[r][v] = _mm512_setzero_ps();
    for (int64_t d = 0; d < dim; ++d) {
      __m512 kv[NK];
      for (int v = 0; v < NK; ++v) {
        kv[v] = _mm512_loadu_ps(k + d * kKeys + h + 16 * v);
        in_register(kv[v]);
      }
      for (int r = 0; r < R; ++r) {
        const __m512 b = _mm512_set1_ps(q[r * dim + d]);
        for (int v = 0; v < NK; ++v) acc[r][v] = _mm512_fmadd_ps(b, kv[v], acc[r][v]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NK; ++v) _mm512_storeu_ps(scores + r * kKeys + h + 16 * v, acc[r][v]);
#elif defined(SGLANG_TILES_AVX2)
    for (int v = 0; v < NK; ++v) {  // 16 keys at a time: 2R accumulators, 2 keys, 1 query
      const float* kv = k + h + 16 * v;
      __m256 acc[R][2];
      for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
      for (int64_t d = 0; d < dim; ++d) {
        __m256 lo = _mm256_loadu_ps(kv + d * kKeys), hi = _mm256_loadu_ps(kv + d * kKeys + 8);
        in_register(lo), in_register(hi);
        for (int r = 0; r < R; ++r) {
          const __m256 b = _mm256_broadcast_ss(q + r * dim + d);
          acc[r][0] = _mm256_fmadd_ps(b, lo, acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(b, hi, acc[r][1]);
        }
      }
      for (int r = 0; r < R; ++r) {
        _mm256_storeu_ps(scores + r * kKeys + h + 16 * v, acc[r][0]);
        _mm256_storeu_ps(scores + r * kKeys + h + 16 * v + 8, acc[r][1]);
      }
    }
#else
    for (int r = 0; r < R; ++r) {
      float* row = scores + r * kKeys + h;
      for (int64_t j = 0; j < 16 * NK; ++j) row[j] = 0.f;
      for (int64_t d = 0; d < dim; ++d) {
        const float b = q[r * dim + d];
        for (int64_t j = 0; j < 16 * NK; ++j) row[j] += b * k[d * kKeys + h + j];
      }
    }
#endif
  }

  // acc[r][d0 : d0 + 16 NV] += sum_j p[r][j] v[j][d0 : ...] over keys [0, n)
  template <int R, int NV>
  static void pv(const float* p, const float* v, int64_t dim, int64_t n, int64_t d0, float* acc) {
    assume_some(n);
#ifdef SGLANG_AVX512
    __m512 a[R][NV];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < NV; ++c) a[r][c] = _mm512_loadu_ps(acc + r * dim + d0 + 16 * c);
    for (int64_t j = 0; j < n; ++j) {
      __m512 vv[NV];
      for (int c = 0; c < NV; ++c) {
        vv[c] = _mm512_loadu_ps(v + j * dim + d0 + 16 * c);
        in_register(vv[c]);
      }
      for (int r = 0; r < R; ++r) {
        const __m512 b = _mm512_set1_ps(p[r * kKeys + j]);
        for (int c = 0; c < NV; ++c) a[r][c] = _mm512_fmadd_ps(b, vv[c], a[r][c]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < NV; ++c) _mm512_storeu_ps(acc + r * dim + d0 + 16 * c, a[r][c]);
#elif defined(SGLANG_TILES_AVX2)
    for (int c = 0; c < NV; ++c) {  // 16 dims at a time: 2R accumulators, 2 values, 1 weight
      const int64_t at = d0 + 16 * c;
      __m256 a[R][2];
      for (int r = 0; r < R; ++r) {
        a[r][0] = _mm256_loadu_ps(acc + r * dim + at);
        a[r][1] = _mm256_loadu_ps(acc + r * dim + at + 8);
      }
      for (int64_t j = 0; j < n; ++j) {
        __m256 lo = _mm256_loadu_ps(v + j * dim + at), hi = _mm256_loadu_ps(v + j * dim + at + 8);
        in_register(lo), in_register(hi);
        for (int r = 0; r < R; ++r) {
          const __m256 b = _mm256_broadcast_ss(p + r * kKeys + j);
          a[r][0] = _mm256_fmadd_ps(b, lo, a[r][0]);
          a[r][1] = _mm256_fmadd_ps(b, hi, a[r][1]);
        }
      }
      for (int r = 0; r < R; ++r) {
        _mm256_storeu_ps(acc + r * dim + at, a[r][0]);
        _mm256_storeu_ps(acc + r * dim + at + 8, a[r][1]);
      }
    }
#else
    for (int r = 0; r < R; ++r)
      for (int64_t j = 0; j < n; ++j) {
        const float b = p[r * kKeys + j];
        float* out = acc + r * dim + d0;
        for (int64_t d = 0; d < 16 * NV; ++d) out[d] += b * v[j * dim + d0 + d];
      }
#endif
  }
};

// ---- bfloat16 pairs for vdpbf16ps: K [dim/2][kKeys][2], V [kKeys/2][dim][2] ----
#ifdef SGLANG_AVX512_BF16
struct PairLayout {
  using Elem = c10::BFloat16;
  static constexpr int64_t kKeyStep = 2;  // P.V consumes keys in pairs

  // K: the 32-bit (dim pair) words of each key, transposed to [dim/2][kKeys].
  static void pack_k(const Elem* const* keys, int64_t n, int64_t dim, Elem* dst) {
    for (int64_t d = 0; d < dim; d += 2) {  // dims outer: the loads of all keys overlap
      Elem* word_row = dst + d / 2 * kKeys * 2;
      for (int64_t j = 0; j < n; ++j) std::memcpy(word_row + 2 * j, keys[j] + d, 2 * sizeof(Elem));
      std::fill(word_row + 2 * n, word_row + 2 * packed_keys(n), Elem(0.f));
    }
  }
  // V: rows j and j + 1 interleaved, 16 dims at a time (dim is a multiple of 16).
  static void pack_v(const Elem* const* values, int64_t n, int64_t dim, Elem* dst) {
    auto row16 = [&](int64_t j, int64_t d) {
      const __m256i x = j < n ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values[j] + d))
                              : _mm256_setzero_si256();
      return _mm512_cvtepu16_epi32(x);
    };
    for (int64_t j = 0; j < packed_keys(n); j += 2)
      for (int64_t d = 0; d < dim; d += 16) {
        const __m512i pairs = _mm512_or_si512(row16(j, d), _mm512_slli_epi32(row16(j + 1, d), 16));
        _mm512_storeu_si512(dst + (j / 2 * dim + d) * 2, pairs);
      }
  }

  static __m512i pair_at(const Elem* p) {
    int32_t bits;
    std::memcpy(&bits, p, sizeof(bits));
    return _mm512_set1_epi32(bits);
  }

  template <int R, int NK>
  static void qk(const Elem* q, const Elem* k, int64_t dim, int64_t h, float* scores) {
    assume_some(dim);
    __m512 acc[R][NK];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NK; ++v) acc[r][v] = _mm512_setzero_ps();
    for (int64_t d = 0; d < dim; d += 2) {
      __m512bh kv[NK];
      for (int v = 0; v < NK; ++v)
        kv[v] = (__m512bh)_mm512_loadu_si512(k + (d / 2 * kKeys + h + 16 * v) * 2);
      for (int r = 0; r < R; ++r) {
        const __m512bh b = (__m512bh)pair_at(q + r * dim + d);
        for (int v = 0; v < NK; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], kv[v], b);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NK; ++v) _mm512_storeu_ps(scores + r * kKeys + h + 16 * v, acc[r][v]);
  }

  template <int R, int NV>
  static void pv(const Elem* p, const Elem* v, int64_t dim, int64_t n, int64_t d0, float* acc) {
    assume_some(n);
    __m512 a[R][NV];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < NV; ++c) a[r][c] = _mm512_loadu_ps(acc + r * dim + d0 + 16 * c);
    for (int64_t j = 0; j < n; j += 2) {
      __m512bh vv[NV];
      for (int c = 0; c < NV; ++c)
        vv[c] = (__m512bh)_mm512_loadu_si512(v + (j / 2 * dim + d0 + 16 * c) * 2);
      for (int r = 0; r < R; ++r) {
        const __m512bh b = (__m512bh)pair_at(p + r * kKeys + j);
        for (int c = 0; c < NV; ++c) a[r][c] = _mm512_dpbf16_ps(a[r][c], vv[c], b);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < NV; ++c) _mm512_storeu_ps(acc + r * dim + d0 + 16 * c, a[r][c]);
  }
};
#endif

#ifdef SGLANG_AVX512
// The lanes of the 16 keys from `at` on that lie in [j0, j1).
inline __mmask16 visible_lanes(int64_t at, int64_t j0, int64_t j1) {
  const uint32_t lo = static_cast<uint32_t>(std::clamp<int64_t>(j0 - at, 0, 16));
  const uint32_t hi = static_cast<uint32_t>(std::clamp<int64_t>(j1 - at, 0, 16));
  return static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
}
#endif

// The largest score of the keys in [j0, j1) (j0 < j1 <= n_padded); the scores of the keys
// past j1 up to n_padded are readable.
inline float block_max(const float* s, int64_t j0, int64_t j1, int64_t n_padded) {
#ifdef SGLANG_AVX512
  __m512 vmax = _mm512_set1_ps(kNegInf);
  if (j0 == 0 && j1 == n_padded) {  // the common case: no mask to build
    int64_t at = 0;
    for (; at + 16 <= n_padded; at += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(s + at));
    if (at < n_padded)  // the lanes past n_padded hold scores of zero-padded keys
      vmax = _mm512_mask_max_ps(vmax, visible_lanes(at, j0, j1), vmax, _mm512_loadu_ps(s + at));
  } else {
    for (int64_t at = j0 / 16 * 16; at < j1; at += 16)
      vmax = _mm512_mask_max_ps(vmax, visible_lanes(at, j0, j1), vmax, _mm512_loadu_ps(s + at));
  }
  return _mm512_reduce_max_ps(vmax);
#elif defined(SGLANG_TILES_AVX2)
  (void)n_padded;  // the keys in [j0, j1): whole vectors of 8, then the rest one by one
  __m256 vmax = _mm256_set1_ps(kNegInf);
  int64_t at = j0;
  for (; at + 8 <= j1; at += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + at));
  float largest = vec::max8(vmax);
  for (; at < j1; ++at) largest = std::max(largest, s[at]);
  return largest;
#else
  (void)n_padded;
  float largest = kNegInf;
  for (int64_t at = j0; at < j1; ++at) largest = std::max(largest, s[at]);
  return largest;
#endif
}

// The weights P = 2^(s scale2 - new_max) of keys [0, n_padded) by whole vectors (0 outside
// [j0, j1)) and their sums, added to the 16 partial sums after those are scaled by alpha.
// Returns the first key left to the caller's scalar loop.
template <typename Elem>
int64_t weights_by_vector(const float* s, int64_t j0, int64_t j1, int64_t n_padded,
                          float scale2, float new_max, float alpha, float* sum_lanes, Elem* p) {
  int64_t j = 0;
#ifdef SGLANG_AVX512
  constexpr int kDegree = std::is_same_v<Elem, float> ? 5 : 3;  // as exact as Elem keeps
  const __m512 vscale = _mm512_set1_ps(scale2), shift = _mm512_set1_ps(new_max);
  __m512 vsum = _mm512_mul_ps(_mm512_loadu_ps(sum_lanes), _mm512_set1_ps(alpha));
  if (j0 == 0 && j1 == n_padded) {  // the common case: no mask to build
    for (; j + 16 <= n_padded; j += 16) {
      const __m512 e = exp2_512<kDegree>(_mm512_fmsub_ps(_mm512_loadu_ps(s + j), vscale, shift));
      store16(p + j, e);
      vsum = _mm512_add_ps(vsum, e);
    }
  } else {
    for (; j + 16 <= n_padded; j += 16) {
      const __m512 x = _mm512_fmsub_ps(_mm512_loadu_ps(s + j), vscale, shift);
      const __m512 e = _mm512_maskz_mov_ps(visible_lanes(j, j0, j1), exp2_512<kDegree>(x));
      store16(p + j, e);
      vsum = _mm512_add_ps(vsum, e);
    }
  }
  _mm512_storeu_ps(sum_lanes, vsum);
#elif defined(SGLANG_TILES_AVX2)
  const __m256 valpha = _mm256_set1_ps(alpha);
  __m256 sum_lo = _mm256_mul_ps(_mm256_loadu_ps(sum_lanes), valpha);
  __m256 sum_hi = _mm256_mul_ps(_mm256_loadu_ps(sum_lanes + 8), valpha);
  if constexpr (std::is_same_v<Elem, float>) {
    const __m256 vscale = _mm256_set1_ps(scale2), shift = _mm256_set1_ps(new_max);
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 lo = _mm256_set1_ps(static_cast<float>(j0));
    const __m256 hi = _mm256_set1_ps(static_cast<float>(j1));
    auto weights = [&](int64_t at) {  // 8 weights from key `at` on, 0 outside [j0, j1)
      const __m256 x = _mm256_fmsub_ps(_mm256_loadu_ps(s + at), vscale, shift);
      const __m256 key = _mm256_add_ps(lane, _mm256_set1_ps(static_cast<float>(at)));
      const __m256 inside = _mm256_and_ps(_mm256_cmp_ps(key, lo, _CMP_GE_OQ),
                                          _mm256_cmp_ps(key, hi, _CMP_LT_OQ));
      return _mm256_and_ps(vec::exp2_nonpositive8(_mm256_min_ps(x, _mm256_setzero_ps())), inside);
    };
    if (j0 == 0 && j1 == n_padded) {  // the common case: no mask to build
      for (; j + 16 <= n_padded; j += 16) {
        const __m256 e0 = vec::exp2_nonpositive8(
            _mm256_fmsub_ps(_mm256_loadu_ps(s + j), vscale, shift));
        const __m256 e1 = vec::exp2_nonpositive8(
            _mm256_fmsub_ps(_mm256_loadu_ps(s + j + 8), vscale, shift));
        _mm256_storeu_ps(p + j, e0);
        _mm256_storeu_ps(p + j + 8, e1);
        sum_lo = _mm256_add_ps(sum_lo, e0);
        sum_hi = _mm256_add_ps(sum_hi, e1);
      }
    }
    for (; j + 16 <= n_padded; j += 16) {
      const __m256 e0 = weights(j), e1 = weights(j + 8);
      _mm256_storeu_ps(p + j, e0);
      _mm256_storeu_ps(p + j + 8, e1);
      sum_lo = _mm256_add_ps(sum_lo, e0);
      sum_hi = _mm256_add_ps(sum_hi, e1);
    }
  }
  _mm256_storeu_ps(sum_lanes, sum_lo);
  _mm256_storeu_ps(sum_lanes + 8, sum_hi);
#else
  (void)s, (void)j0, (void)j1, (void)n_padded, (void)scale2, (void)new_max, (void)p;
  for (int l = 0; l < 16; ++l) sum_lanes[l] *= alpha;
#endif
  return j;
}

// Scaled, masked scores of one row -> P (rounded to Elem) for keys [0, n_padded); updates the
// row's running max and its sum (kept as 16 partial sums) and rescales its accumulator. Keys
// outside [j0, j1) get P = 0. The sum is of the weights before rounding to Elem, so rounding
// perturbs each normalized weight by at most Elem's unit roundoff. row_max is kept in base 2
// (scaled by log2 e), so each weight is one FMA and one 2^t.
template <typename Elem>
void softmax_step(const float* s, int64_t j0, int64_t j1, int64_t n_padded, float scale,
                  float& row_max, float* sum_lanes, float* acc, int64_t dim, Elem* p) {
  if (j0 >= j1) {  // no key of this block is visible to the row
    std::fill(p, p + n_padded, Elem(0.f));
    return;
  }
  const float scale2 = scale * 1.4426950408889634f;  // scores -> base-2 exponents
  const float new_max = std::max(row_max, block_max(s, j0, j1, n_padded) * scale2);
  const float alpha = row_max == new_max ? 1.f : std::exp2(row_max - new_max);  // 0 at first
  int64_t j = weights_by_vector(s, j0, j1, n_padded, scale2, new_max, alpha, sum_lanes, p);
  for (; j < n_padded; ++j) {
    const float e = j >= j0 && j < j1 ? std::exp2(s[j] * scale2 - new_max) : 0.f;
    p[j] = Elem(e);
    sum_lanes[j % 16] += e;
  }
  row_max = new_max;
  if (alpha != 1.f)
    for (int64_t d = 0; d < dim; ++d) acc[d] *= alpha;
}

}  // namespace prefill_tiles
