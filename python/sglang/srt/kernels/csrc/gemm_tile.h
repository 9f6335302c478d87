// The native bfloat16 GEMM's micro-kernel over one packed panel (see gemm_bf16.cpp for the
// layout and the tile) and its helpers, shared by gemm_bf16.cpp and linear_quant.cpp (whose
// int8 / int4 codes are stored in the same panel order). Compiled where AVX512-BF16 is present
// (SGLANG_GEMM_TILE), unless SGLANG_PORTABLE_KERNELS asks for the plain C++ paths.

#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    !defined(SGLANG_PORTABLE_KERNELS)
#include <immintrin.h>
#define SGLANG_GEMM_TILE 1
#endif

namespace gemm_tile {

constexpr int64_t kPanelCols = 64;  // output columns per panel (4 vectors of 16)
constexpr int kTileRows = 7;        // rows per micro-kernel (28 accumulators)

template <int R, typename Tile>
inline void sized_tile(int64_t left, int64_t r, const Tile& tile) {
  if constexpr (R > 0) {
    if (left == R) {
      tile(std::integral_constant<int, R>{}, r);
    } else {
      sized_tile<R - 1>(left, r, tile);
    }
  }
}

// tile(std::integral_constant<int, R>, first row) over rows [0, rows): as few tiles of at most
// MaxRows as cover them, their sizes differing by at most one (16 rows of 7 at most: 6, 5, 5,
// not 7, 7, 2, whose last tile streams the panel for two rows). A row's outputs do not depend
// on the tile it is in.
template <int MaxRows, typename Tile>
inline void row_tiles(int64_t rows, const Tile& tile) {
  const int64_t count = (rows + MaxRows - 1) / MaxRows;
  for (int64_t i = 0, r = 0; i < count; ++i) {
    const int64_t size = (rows - r + count - i - 1) / (count - i);
    sized_tile<MaxRows>(size, r, tile);
    r += size;
  }
}

#ifdef SGLANG_GEMM_TILE
// 16 float32 outputs rounded to bfloat16 (nearest even) into dst, the first `left` of them.
inline void store16(__m512 y, uint16_t* dst, int64_t left) {
  const __m256i v = (__m256i)_mm512_cvtneps_pbh(y);
  if (left >= 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), v);
  } else if (left > 0) {
    _mm256_mask_storeu_epi16(dst, static_cast<__mmask16>((1u << left) - 1), v);
  }
}

// acc[r] += x[r]'s input pair p times the panel's four vectors w, for rows [0, R).
template <int R>
inline void multiply_pair(__m512 (*acc)[4], const uint16_t* a, int64_t lda, int64_t p,
                          const __m512bh* w) {
  for (int r = 0; r < R; ++r) {
    int32_t pair;
    std::memcpy(&pair, a + r * lda + 2 * p, sizeof(pair));
    const __m512bh x = (__m512bh)_mm512_set1_epi32(pair);
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], x, w[v]);
  }
}

// out rows [0, R) x columns [0, cols) of a panel; a: R rows of x (lda apart), b: the panel,
// bias: its 64 float32 biases.
template <int R>
void tile(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t pairs, const float* bias,
          uint16_t* out, int64_t ldo, int64_t cols) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_loadu_ps(bias + 16 * v);
  if (pairs < 1) __builtin_unreachable();  // keeps the accumulators out of stack slots
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh w[4];
    for (int v = 0; v < 4; ++v)
      w[v] = (__m512bh)_mm512_loadu_si512(b + (p * kPanelCols + 16 * v) * 2);
    multiply_pair<R>(acc, a, lda, p, w);
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) store16(acc[r][v], out + r * ldo + 16 * v, cols - 16 * v);
}

// Rows [0, rows) of x times one panel.
inline void panel_rows(const uint16_t* x, int64_t lda, int64_t rows, const uint16_t* panel,
                       int64_t pairs, const float* bias, uint16_t* out, int64_t ldo, int64_t cols) {
  row_tiles<kTileRows>(rows, [&](auto tile_rows, int64_t r) {
    tile<decltype(tile_rows)::value>(x + r * lda, lda, panel, pairs, bias, out + r * ldo, ldo,
                                     cols);
  });
}
#endif

}  // namespace gemm_tile
