// linear_quant.cpp's int8 and int4 products on AVX2 + FMA (CPUs without AVX512-BF16: Zen 1-3,
// Intel before Ice Lake), over the same panels as the AVX512-BF16 tile. Used where
// SGLANG_QUANT_AVX2 is defined.
//
// x (bfloat16, or float32 where the model runs in float32) is taken as float32; codes become
// exact float32 and are multiplied in float32 (each product of a bfloat16 input and a code is
// exact). Per output the even inputs (2 p) and the odd inputs (2 p + 1) are summed apart, each
// in input order, and the two sums added: int8 over all inputs, int4 per group (then the
// group's offset taken off and its scale and min applied, as the AVX512 tile does). The order
// depends only on the output, so a row's outputs are the same bits whatever the batch and the
// threads. Up to four rows (decode) convert the codes in registers as they stream; more rows
// convert a stretch of the panel once into an L1 buffer that every tile of rows then reads.

#pragma once

#if defined(__AVX2__) && defined(__FMA__) && !defined(SGLANG_GEMM_TILE) && \
    !defined(SGLANG_PORTABLE_KERNELS)
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "gemm_tile.h"

#define SGLANG_QUANT_AVX2 1

namespace quant_avx2 {

using gemm_tile::kPanelCols;
constexpr int64_t kStreamingRows = 4;  // at most this many rows convert codes in registers
constexpr int64_t kSpanPairs = 128;  // int8: 16 KB of codes per span
constexpr int kInt8TileRows = 3;     // 12 accumulators
constexpr int kInt4TileRows = 3;     // 2 column vectors x even / odd x 3 rows: 12 accumulators

// x (m, k) as float32: bfloat16 (uint16_t) widened into `widened` (exact), float32 as it is.
inline const float* as_float(const uint16_t* x, int64_t m, int64_t k,
                             std::vector<float>& widened) {
  widened.resize(m * k);
  at::parallel_for(0, m, 8, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * k; i < end * k; ++i) {
      const uint32_t bits = static_cast<uint32_t>(x[i]) << 16;
      std::memcpy(&widened[i], &bits, sizeof(float));
    }
  });
  return widened.data();
}
inline const float* as_float(const float* x, int64_t, int64_t, std::vector<float>&) { return x; }

// y rounded to the output's type: bfloat16 (its bits) or float32.
inline void store_as(uint16_t* out, float y) { *out = c10::BFloat16(y).x; }
inline void store_as(float* out, float y) { *out = y; }

// [x 2p, x 2p + 1] four times.
inline __m256 input_pair(const float* x, int64_t p) {
  return _mm256_castpd_ps(_mm256_broadcast_sd(reinterpret_cast<const double*>(x + 2 * p)));
}

// m rows of int8 outputs from their lane sums (each column's even and odd inputs apart).
template <typename Out>
inline void store_int8_rows(const float (*sums)[2 * kPanelCols], int64_t m, const float* scale,
                            const float* bias, Out* out, int64_t ldo, int64_t cols) {
  cols = std::min(cols, kPanelCols);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float sum = sums[r][2 * c] + sums[r][2 * c + 1];
      store_as(out + r * ldo + c, std::fma(sum, scale[c], bias[c]));
    }
}

// Eight int4 outputs of a row take one group: `sum` of (128 + code) x over the group, less
// 128 x the group's input sum, times the scale, plus the min times that input sum.
inline void add_group(float* total, __m256 sum, __m256 scale, __m256 min, float xsum) {
  __m256 t = _mm256_load_ps(total);
  t = _mm256_fmadd_ps(_mm256_sub_ps(sum, _mm256_set1_ps(128.f * xsum)), scale, t);
  t = _mm256_fmadd_ps(min, _mm256_set1_ps(xsum), t);
  _mm256_store_ps(total, t);
}

template <typename Out>
inline void store_int4_rows(const float (*total)[kPanelCols], int64_t m, const float* bias,
                            Out* out, int64_t ldo, int64_t cols) {
  cols = std::min(cols, kPanelCols);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < cols; ++c) store_as(out + r * ldo + c, total[r][c] + bias[c]);
}

// The `lines` cache lines from `from` on into L1.
inline void prefetch(const void* from, int64_t lines) {
  for (int64_t l = 0; l < lines; ++l)
    _mm_prefetch(static_cast<const char*>(from) + 64 * l, _MM_HINT_T0);
}

// --- int8: panel (pairs, 64, 2). Quarter q of a pair (its bytes [32 q, 32 q + 32)) is four
// vectors of 8 codes; lane 2 i + t of vector v is column 16 q + 4 v + i, input 2 p + t, so each
// lane sums one parity of one column. sums[r] holds the 128 lanes of a row (carried over spans).
template <int R>
inline void int8_quarter(const float* x, int64_t ldx, const int8_t* codes, int64_t p0,
                         int64_t p1, float* sums, int64_t lds, bool fetch_odd_lines) {
  __m256 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm256_loadu_ps(sums + r * lds + 8 * v);
  for (int64_t p = p0; p < p1; ++p) {
    // the first quarter reads every other line (a pair is two): fetch the other ones ahead
    if (fetch_odd_lines) prefetch(codes + (p + 8) * 128 + 64, 1);
    __m256 xp[R];
    for (int r = 0; r < R; ++r) xp[r] = input_pair(x + r * ldx, p);
    for (int v = 0; v < 4; ++v) {
      const __m128i bytes =
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + p * 128 + 8 * v));
      const __m256 w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
      for (int r = 0; r < R; ++r) acc[r][v] = _mm256_fmadd_ps(w, xp[r], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) _mm256_storeu_ps(sums + r * lds + 8 * v, acc[r][v]);
}

// Rows [0, m) (at most kStreamingRows) of x times panel `codes` (pairs x 128 bytes); out: m rows of
// the panel's outputs (`cols` of them where fewer than 64), ldo apart.
template <typename Out>
void int8_panel(const float* x, int64_t ldx, int64_t m, const int8_t* codes, int64_t pairs,
                const float* scale, const float* bias, Out* out, int64_t ldo, int64_t cols) {
  alignas(32) float sums[kStreamingRows][2 * kPanelCols] = {};
  for (int64_t p0 = 0; p0 < pairs; p0 += kSpanPairs) {
    const int64_t p1 = std::min(pairs, p0 + kSpanPairs);
    gemm_tile::row_tiles<kInt8TileRows>(m, [&](auto tile_rows, int64_t r) {
      constexpr int R = decltype(tile_rows)::value;
      for (int q = 0; q < 4; ++q)
        int8_quarter<R>(x + r * ldx, ldx, codes + 32 * q, p0, p1, sums[r] + 32 * q,
                        2 * kPanelCols, q == 0 && r == 0);
    });
  }
  store_int8_rows(sums, m, scale, bias, out, ldo, cols);
}

// --- int4: a pair's 64 bytes are 16 words (linear_quant.cpp's layout); half h (bytes
// [32 h, 32 h + 32)) holds columns 16 v + 8 h + lane for v = 0..3, one vector each after a shift
// by 4 v. From a vector's words, (w >> 4 v) & 0x000F000F | 0x43004300 holds the bfloat16 of
// 128 + code for both inputs: shifted left by 16 the even one is float32, masked the odd one.
template <int R, int V>
inline void int4_half(const float* x, int64_t ldx, const uint8_t* codes, int64_t p0, int64_t p1,
                      int v0, __m256 (*even)[V], __m256 (*odd)[V]) {
  const __m256i nibbles = _mm256_set1_epi32(0x000F000F), bias = _mm256_set1_epi32(0x43004300);
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) even[r][v] = odd[r][v] = _mm256_setzero_ps();
  for (int64_t p = p0; p < p1; ++p) {
    const __m256i words = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + p * 64));
    __m256 xe[R], xo[R];
    for (int r = 0; r < R; ++r) {
      xe[r] = _mm256_broadcast_ss(x + r * ldx + 2 * p);
      xo[r] = _mm256_broadcast_ss(x + r * ldx + 2 * p + 1);
    }
    for (int v = 0; v < V; ++v) {
      const __m256i shifted = _mm256_srli_epi32(words, 4 * (v0 + v));
      const __m256i w = _mm256_or_si256(_mm256_and_si256(shifted, nibbles), bias);
      const __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
      const __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(w, high));
      for (int r = 0; r < R; ++r) {
        even[r][v] = _mm256_fmadd_ps(we, xe[r], even[r][v]);
        odd[r][v] = _mm256_fmadd_ps(wo, xo[r], odd[r][v]);
      }
    }
  }
}

inline __m256 load8(const uint16_t* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

// Rows [0, m) (at most kStreamingRows) of x times one int4 panel: codes (pairs x 64 bytes), scale
// and min (groups x 64), sums: each row's group input sums (groups apart).
template <typename Scale, typename Out>
void int4_panel(const float* x, int64_t ldx, int64_t m, const uint8_t* codes, int64_t pairs,
                int64_t group, const Scale* scale, const Scale* min, const float* group_sums,
                const float* bias, Out* out, int64_t ldo, int64_t cols) {
  const int64_t groups = 2 * pairs / group, group_pairs = group / 2;
  alignas(32) float total[kStreamingRows][kPanelCols] = {};
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t p0 = g * group_pairs, p1 = p0 + group_pairs;
    gemm_tile::row_tiles<kInt4TileRows>(m, [&](auto tile_rows, int64_t r) {
      constexpr int R = decltype(tile_rows)::value;
      constexpr int V = R == 1 ? 4 : 2;
      for (int h = 0; h < 2; ++h)
        for (int v0 = 0; v0 < 4; v0 += V) {
          __m256 even[R][V], odd[R][V];
          int4_half<R, V>(x + r * ldx, ldx, codes + 32 * h, p0, p1, v0, even, odd);
          for (int v = 0; v < V; ++v) {
            const int64_t c = 16 * (v0 + v) + 8 * h;
            const __m256 s = load8(scale + g * kPanelCols + c);
            const __m256 lo = load8(min + g * kPanelCols + c);
            for (int i = 0; i < R; ++i) {
              add_group(total[r + i] + c, _mm256_add_ps(even[i][v], odd[i][v]), s, lo,
                        group_sums[(r + i) * groups + g]);
            }
          }
        }
    });
  }
  store_int4_rows(total, m, bias, out, ldo, cols);
}

// --- Batches (more than kStreamingRows rows): a stretch of a panel's codes is first written out
// as float32 into a buffer that stays in L1, in the int8 lane order (lane 2 i + t: one column,
// input parity t), then every tile of rows multiplies it with float32 FMAs. Each lane sums the
// same products in the same order as the streaming loops above, so a row's outputs are the same
// bits on either path; the conversion is paid once per block of rows instead of once per tile.
constexpr int64_t kBufferedBlockRows = 48;
constexpr int64_t kBufferedSpanPairs = 32;  // int8: 4 KB of codes, 16 KB as float32
constexpr int kFloatTileRows = 6;  // 6 rows x 2 vectors: 12 accumulators

// acc[r][0..1] += the buffer's two vectors of each pair times row r's input pair, pairs in order.
template <int R>
inline void float_pairs(const float* x, int64_t ldx, int64_t p0, const float* w, int64_t stride,
                        int64_t pairs, __m256 (*acc)[2]) {
  for (int64_t p = 0; p < pairs; ++p) {
    const __m256 w0 = _mm256_loadu_ps(w + p * stride), w1 = _mm256_loadu_ps(w + p * stride + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 xp = input_pair(x + r * ldx, p0 + p);
      acc[r][0] = _mm256_fmadd_ps(w0, xp, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(w1, xp, acc[r][1]);
    }
  }
}

// int8_panel for up to kBufferedBlockRows rows: kBufferedSpanPairs pairs at a time converted
// whole (read in order), the next span's codes fetched while the rows multiply.
template <typename Out>
void int8_panel_buffered(const float* x, int64_t ldx, int64_t m, const int8_t* codes,
                         int64_t pairs, const float* scale, const float* bias, Out* out,
                         int64_t ldo, int64_t cols) {
  alignas(32) float sums[kBufferedBlockRows][2 * kPanelCols] = {};
  alignas(32) float buffer[kBufferedSpanPairs * 2 * kPanelCols];
  for (int64_t p0 = 0; p0 < pairs; p0 += kBufferedSpanPairs) {
    const int64_t p1 = std::min(pairs, p0 + kBufferedSpanPairs);
    for (int64_t p = p0; p < p1; ++p)
      for (int v = 0; v < 16; ++v) {
        const __m128i bytes =
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + p * 128 + 8 * v));
        _mm256_store_ps(buffer + (p - p0) * 128 + 8 * v,
                        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)));
      }
    prefetch(codes + p1 * 128, 2 * (std::min(pairs, p1 + kBufferedSpanPairs) - p1));
    for (int64_t lane0 = 0; lane0 < 2 * kPanelCols; lane0 += 16) {
      gemm_tile::row_tiles<kFloatTileRows>(m, [&](auto tile_rows, int64_t r) {
        constexpr int R = decltype(tile_rows)::value;
        __m256 acc[R][2];
        for (int i = 0; i < R; ++i)
          for (int v = 0; v < 2; ++v) acc[i][v] = _mm256_load_ps(sums[r + i] + lane0 + 8 * v);
        float_pairs<R>(x + r * ldx, ldx, p0, buffer + lane0, 128, p1 - p0, acc);
        for (int i = 0; i < R; ++i)
          for (int v = 0; v < 2; ++v) _mm256_store_ps(sums[r + i] + lane0 + 8 * v, acc[i][v]);
      });
    }
  }
  store_int8_rows(sums, m, scale, bias, out, ldo, cols);
}

// int4_panel for up to kBufferedBlockRows rows: each half of a group converted once. Shift v of
// half h (columns 16 v + 8 h + 0..7) becomes two vectors, unpacked from the words' bfloat16s:
// the low one holds columns 0, 1, 4, 5 of the eight, the high one 2, 3, 6, 7, so adding the
// neighbouring lanes of the two (hadd) gives the eight columns' sums in order.
template <typename Scale, typename Out>
void int4_panel_buffered(const float* x, int64_t ldx, int64_t m, const uint8_t* codes,
                         int64_t pairs, int64_t group, const Scale* scale, const Scale* min,
                         const float* group_sums, const float* bias, Out* out, int64_t ldo,
                         int64_t cols) {
  const int64_t groups = 2 * pairs / group, group_pairs = group / 2;
  const __m256i nibbles = _mm256_set1_epi32(0x000F000F), offset = _mm256_set1_epi32(0x43004300);
  const __m256i zero = _mm256_setzero_si256();
  alignas(32) float total[kBufferedBlockRows][kPanelCols] = {};
  thread_local std::vector<float> buffer;
  buffer.resize(group_pairs * kPanelCols);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t p0 = g * group_pairs;
    for (int h = 0; h < 2; ++h) {
      if (h == 0) prefetch(codes + (p0 + group_pairs) * 64, g + 1 < groups ? group_pairs : 0);
      for (int64_t p = 0; p < group_pairs; ++p) {
        const __m256i words =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + (p0 + p) * 64 + 32 * h));
        for (int v = 0; v < 4; ++v) {
          const __m256i w = _mm256_or_si256(
              _mm256_and_si256(_mm256_srli_epi32(words, 4 * v), nibbles), offset);
          float* dst = buffer.data() + p * kPanelCols + 16 * v;
          _mm256_storeu_ps(dst, _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, w)));
          _mm256_storeu_ps(dst + 8, _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, w)));
        }
      }
      gemm_tile::row_tiles<kFloatTileRows>(m, [&](auto tile_rows, int64_t r) {
        constexpr int R = decltype(tile_rows)::value;
        for (int v = 0; v < 4; ++v) {
          __m256 acc[R][2];
          for (int i = 0; i < R; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
          float_pairs<R>(x + r * ldx, ldx, p0, buffer.data() + 16 * v, kPanelCols, group_pairs,
                         acc);
          const int64_t c = 16 * v + 8 * h;
          const __m256 s = load8(scale + g * kPanelCols + c);
          const __m256 lo = load8(min + g * kPanelCols + c);
          for (int i = 0; i < R; ++i) {
            add_group(total[r + i] + c, _mm256_hadd_ps(acc[i][0], acc[i][1]), s, lo,
                      group_sums[(r + i) * groups + g]);
          }
        }
      });
    }
  }
  store_int4_rows(total, m, bias, out, ldo, cols);
}

// Every panel on the threads, one contiguous run of panels each (one sequential stream per
// thread), each panel's rows in blocks (the panel's codes come back from the caches for the
// later blocks): streaming(j, first row, rows) for a few rows, buffered(...) for more.
template <typename Streaming, typename Buffered>
void run(int64_t panels, int64_t m, const Streaming& streaming, const Buffered& buffered) {
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      if (m <= kStreamingRows) {
        streaming(j, 0, m);
        continue;
      }
      for (int64_t r = 0; r < m; r += kBufferedBlockRows)
        buffered(j, r, std::min(kBufferedBlockRows, m - r));
    }
  });
}

}  // namespace quant_avx2
#endif
