// Dynamic int8 linears on a CPU: y = x W^T (+ b) with x quantized per row as it arrives and
// W int8 per output channel (SGLang's --torchao-config int8dq) or int4 per group (8da4w-<group>,
// further below: linear_int4), multiplied in integers.
//
//   x:  each row r to int8 codes p[r, k] = round_half_even(x[r, k] / sx[r]), sx[r] = max |x[r]|
//       / 127 (float32 division, as torch computes it);
//   W:  W[c, k] = sw[c] q[c, k], q in -128..127 (quantized_linear.quantize_int8);
//   y[r, c] = fma(float(sum_k p[r, k] q[c, k]), sx[r] sw[c], b[c]), rounded to x's dtype
//   (bfloat16, or float32 for a model served with float32 activations).
//
// The integer sum is exact (int32: |p q| <= 127 * 128, so K up to 131,000 inputs cannot
// overflow), so the result depends neither on the order of the sum, the batch, the tile nor the
// thread count, and the portable loop gives the same bits as the vector path.
//
// Layout, the operand order of AVX512-VNNI's vpdpbusd: panels of 64 output columns, for each
// quad of inputs (4 i .. 4 i + 3) the four codes of a column side by side: (panels, quads, 64, 4)
// int8, zero past the weight's out or in. vpdpbusd multiplies unsigned by signed bytes: the
// activations travel as p + 128 (0..255), and 128 sum_k q[c, k] (`offset`, int32, made with the
// panels by quantized_linear.pack_int8_quads) is taken off each sum. A tile keeps 6 rows x 64
// columns in 24 int32 registers over a span of K (see panel_rows): per quad, 4 weight vectors
// loaded once and one 32-bit broadcast per row, 4 vpdpbusd per row (each 64 multiply-adds,
// twice vdpbf16ps's 32); 0.89 of vpdpbusd's peak on one Zen 4 core (948 of 1,070 GOPS,
// cache-resident).
// Tasks are as in gemm_bf16.cpp: (panel, block of rows) from a shared counter; with one block
// each thread streams one contiguous run of panels.

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>  // bindings only (torch/extension.h builds twice as long)

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "gemm_tile.h"
#include "panel_bias.h"
#include "run_tasks.h"

#if defined(SGLANG_GEMM_TILE) && defined(__AVX512VNNI__)
#define SGLANG_INT8_TILE 1
#define SGLANG_COMPILED_ISA "avx512_vnni"
#elif defined(__AVX2__) && !defined(SGLANG_PORTABLE_KERNELS)
#include <immintrin.h>
#define SGLANG_INT8_AVX2 1
#define SGLANG_COMPILED_ISA "avx2"
#else
#define SGLANG_COMPILED_ISA "portable"
#endif
#if defined(__AVX2__) && !defined(SGLANG_PORTABLE_KERNELS)
#include <immintrin.h>
#define SGLANG_INT4_AVX2 1  // 8da4w's AVX2 path (and its helpers for the VNNI one)
#endif

namespace {

using gemm_tile::kPanelCols;
using gemm_tile::kTileRows;
constexpr int64_t kQuadBytes = 4 * kPanelCols;
constexpr int64_t kBlockRows = 14 * kTileRows;

// Which blocks of a span's successor a pass over the span fetches: every `every`-th from the
// `phase`-th, so that the passes over a span (one per tile of rows) share the fetching.
struct FetchShare {
  int64_t phase;
  int64_t every;
};

inline float to_float(uint16_t bf16) {
  uint32_t bits = static_cast<uint32_t>(bf16) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
inline float to_float(float v) { return v; }

// y rounded to the output's type: bfloat16 (its bits) or float32.
inline void store_as(uint16_t* out, float y) { *out = c10::BFloat16(y).x; }
inline void store_as(float* out, float y) { *out = y; }

#ifdef SGLANG_INT8_TILE
// Up to 16 bfloat16 values (the first `left`) as float32.
inline __m512 load16(const uint16_t* src, int64_t left) {
  const __mmask16 mask = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, src));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
#endif

// Row r of x (bfloat16 bits or float32) as p + 128 (uint8) into out, its scale returned; the
// same bits on every path (IEEE division and round-half-even per value).
template <typename T>
float quantize_row(const T* row, int64_t k, uint8_t* out) {
#ifdef SGLANG_INT8_TILE
  if constexpr (std::is_same_v<T, uint16_t>) {
    __m512 most = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i += 16)
      most = _mm512_max_ps(most, _mm512_abs_ps(load16(row + i, k - i)));
    const float largest = _mm512_reduce_max_ps(most);
    const float scale = largest > 0.f ? largest / 127.f : 1.f;
    const __m512 step = _mm512_set1_ps(scale), low = _mm512_set1_ps(-127.f);
    const __m512 high = _mm512_set1_ps(127.f);
    const __m512i shift = _mm512_set1_epi32(128);
    for (int64_t i = 0; i < k; i += 16) {
      const int64_t left = k - i;
      const __mmask16 mask = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
      __m512 v = _mm512_div_ps(load16(row + i, left), step);
      v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      v = _mm512_min_ps(_mm512_max_ps(v, low), high);
      const __m512i code = _mm512_add_epi32(_mm512_cvtps_epi32(v), shift);
      _mm512_mask_cvtepi32_storeu_epi8(out + i, mask, code);
    }
    return largest > 0.f ? scale : 0.f;
  }
#endif
  float largest = 0.f;
  for (int64_t i = 0; i < k; ++i) largest = std::max(largest, std::fabs(to_float(row[i])));
  const float scale = largest > 0.f ? largest / 127.f : 1.f;
  for (int64_t i = 0; i < k; ++i) {
    const float v = std::nearbyint(to_float(row[i]) / scale);
    out[i] = static_cast<uint8_t>(static_cast<int>(std::clamp(v, -127.f, 127.f)) + 128);
  }
  return largest > 0.f ? scale : 0.f;
}

// Each row of x (m, k) as p + 128 (uint8, rows of quads * 4 bytes, 128 past k, which the zero
// codes there ignore) and its scale (0 for a row of zeros).
template <typename T>
void quantize_rows(const T* x, int64_t m, int64_t k, int64_t quads, uint8_t* codes,
                   float* scales) {
  at::parallel_for(0, m, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      uint8_t* out = codes + r * quads * 4;
      scales[r] = quantize_row(x + r * k, k, out);
      std::fill(out + k, out + quads * 4, uint8_t{128});
    }
  });
}

struct Panel {
  const int8_t* codes;    // (quads, 64, 4)
  const int32_t* offset;  // 64
  const float* scale;     // 64 weight scales
  const float* bias;      // 64
  int64_t quads;
};

#ifdef SGLANG_INT8_TILE
// Row r's 64 integer sums (`total`) to bfloat16: the offset taken off, then fma(sum, sx[r] sw[c],
// b[c]).
template <typename Out>
inline void store_row(const int32_t* total, float row_scale, const Panel& p, Out* out,
                      int64_t cols) {
  const __m512 sx = _mm512_set1_ps(row_scale);
  for (int v = 0; v < 4; ++v) {
    const __m512i exact = _mm512_sub_epi32(_mm512_load_si512(total + 16 * v),
                                           _mm512_loadu_si512(p.offset + 16 * v));
    const __m512 scale = _mm512_mul_ps(sx, _mm512_loadu_ps(p.scale + 16 * v));
    const __m512 y =
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), scale, _mm512_loadu_ps(p.bias + 16 * v));
    const int64_t left = cols - 16 * v;
    if constexpr (std::is_same_v<Out, float>) {
      if (left > 0)
        _mm512_mask_storeu_ps(out + 16 * v,
                              left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1), y);
    } else {
      gemm_tile::store16(y, out + 16 * v, left);
    }
  }
}

// Rows [0, R) (up to 3: 12 accumulators, few enough for the intrinsic, see tile6): total += their
// sums over quads [q0, q1).
template <int R>
void tile(const uint8_t* a, int64_t lda, const Panel& p, int64_t q0, int64_t q1, int32_t* total) {
  __m512i acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_load_si512(total + r * kPanelCols + 16 * v);
  if (q1 <= q0) __builtin_unreachable();  // keeps the accumulators out of stack slots
  for (int64_t i = q0; i < q1; ++i) {
    __m512i w[4];
    for (int v = 0; v < 4; ++v) w[v] = _mm512_loadu_si512(p.codes + i * kQuadBytes + 64 * v);
    for (int r = 0; r < R; ++r) {
      int32_t quad;
      std::memcpy(&quad, a + r * lda + 4 * i, sizeof(quad));
      const __m512i x = _mm512_set1_epi32(quad);
      for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], x, w[v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) _mm512_store_si512(total + r * kPanelCols + 16 * v, acc[r][v]);
}

// Six rows at once with the accumulators as named variables and each product an in-place
// vpdpbusd: GCC's intrinsic copies every accumulator before and after each product once 16 or
// more are live (half the issue slots go to register moves).
#define SGLANG_DPBUSD(acc, x, w) asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(x), "v"(w))
#define SGLANG_AT(r, v) (total + (r) * kPanelCols + 16 * (v))
#define SGLANG_ROW_ACC(r)                                                         \
  __m512i c##r##0 = _mm512_load_si512(SGLANG_AT(r, 0)),                          \
          c##r##1 = _mm512_load_si512(SGLANG_AT(r, 1)),                          \
          c##r##2 = _mm512_load_si512(SGLANG_AT(r, 2)),                          \
          c##r##3 = _mm512_load_si512(SGLANG_AT(r, 3))
#define SGLANG_ROW_STEP(r)                                                   \
  {                                                                          \
    int32_t quad;                                                            \
    std::memcpy(&quad, a + r * lda + 4 * i, sizeof(quad));                   \
    const __m512i x = _mm512_set1_epi32(quad);                               \
    SGLANG_DPBUSD(c##r##0, x, w0);                                           \
    SGLANG_DPBUSD(c##r##1, x, w1);                                           \
    SGLANG_DPBUSD(c##r##2, x, w2);                                           \
    SGLANG_DPBUSD(c##r##3, x, w3);                                           \
  }
#define SGLANG_ROW_KEEP(r)                      \
  _mm512_store_si512(SGLANG_AT(r, 0), c##r##0); \
  _mm512_store_si512(SGLANG_AT(r, 1), c##r##1); \
  _mm512_store_si512(SGLANG_AT(r, 2), c##r##2); \
  _mm512_store_si512(SGLANG_AT(r, 3), c##r##3);

void tile6(const uint8_t* a, int64_t lda, const Panel& p, int64_t q0, int64_t q1, int32_t* total) {
  SGLANG_ROW_ACC(0); SGLANG_ROW_ACC(1); SGLANG_ROW_ACC(2);
  SGLANG_ROW_ACC(3); SGLANG_ROW_ACC(4); SGLANG_ROW_ACC(5);
  for (int64_t i = q0; i < q1; ++i) {
    const int8_t* q = p.codes + i * kQuadBytes;
    const __m512i w0 = _mm512_loadu_si512(q), w1 = _mm512_loadu_si512(q + 64);
    const __m512i w2 = _mm512_loadu_si512(q + 128), w3 = _mm512_loadu_si512(q + 192);
    SGLANG_ROW_STEP(0) SGLANG_ROW_STEP(1) SGLANG_ROW_STEP(2)
    SGLANG_ROW_STEP(3) SGLANG_ROW_STEP(4) SGLANG_ROW_STEP(5)
  }
  SGLANG_ROW_KEEP(0) SGLANG_ROW_KEEP(1) SGLANG_ROW_KEEP(2)
  SGLANG_ROW_KEEP(3) SGLANG_ROW_KEEP(4) SGLANG_ROW_KEEP(5)
}
#undef SGLANG_ROW_KEEP
#undef SGLANG_ROW_STEP
#undef SGLANG_ROW_ACC
#undef SGLANG_AT
#undef SGLANG_DPBUSD
#endif

#ifdef SGLANG_INT8_AVX2
// AVX2 (no VNNI): kRows rows (lda apart) times the 64 columns of a panel, each row's total (64
// apart) += sum over quads [q0, q1) of p q with p = a - 128, the signed activation codes
// (|p| <= 127). vpmaddubsw multiplies unsigned by signed bytes and saturates the sum of each pair
// to 16 bits, so it takes |q| (<= 128) against p carrying q's sign: a pair's sum stays within
// 2 x 128 x 127 < 2^15, and vpmaddwd adds the pairs into int32. The sums are exact: the same
// integers as VNNI's once its offset is taken off. The pass also fetches the codes one span
// (kRowSpanQuads) further on: of every quad, or with kShared of the quads `fetch` names.
constexpr int64_t kRowSpanQuads = 64;
template <int kRows, bool kShared>
void row_avx2(const uint8_t* a, int64_t lda, const Panel& p, int64_t q0, int64_t q1,
              FetchShare fetch, int32_t* total) {
  __m256i acc[kRows][8];
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < 8; ++v)
      acc[r][v] =
          _mm256_load_si256(reinterpret_cast<const __m256i*>(total + r * kPanelCols + 8 * v));
  const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8(-128);
  int64_t next_fetch = q0 + fetch.phase;
  for (int64_t i = q0; i < q1; ++i) {
    const int8_t* q = p.codes + i * kQuadBytes;  // 4 codes per column
    if (!kShared || i == next_fetch) {
      next_fetch += fetch.every;
      if (i + kRowSpanQuads < p.quads)
        for (int line = 0; line < 4; ++line)
          _mm_prefetch(reinterpret_cast<const char*>(q + kRowSpanQuads * kQuadBytes + 64 * line),
                       _MM_HINT_T0);
    }
    __m256i x[kRows];
    for (int r = 0; r < kRows; ++r) {
      int32_t quad;
      std::memcpy(&quad, a + r * lda + 4 * i, sizeof(quad));
      x[r] = _mm256_xor_si256(_mm256_set1_epi32(quad), flip);
    }
    for (int v = 0; v < 8; ++v) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * v));
      const __m256i magnitude = _mm256_abs_epi8(w);
      for (int r = 0; r < kRows; ++r) {
        const __m256i s = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(x[r], w));
        acc[r][v] = _mm256_add_epi32(acc[r][v], _mm256_madd_epi16(s, ones));
      }
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < 8; ++v)
      _mm256_store_si256(reinterpret_cast<__m256i*>(total + r * kPanelCols + 8 * v), acc[r][v]);
}

// Every row times a panel, rows taking all 64 columns at once (8 accumulators each), by spans of
// kRowSpanQuads quads (16 KB of codes, in L1), two rows a pass: each pass reads the span from L1
// (the first from memory, as it arrives) and fetches its share of the next span, every
// passes-th quad. Tiles of more rows sharing each code vector need more accumulators than AVX2
// has registers, so they took the columns in several passes, each reading a part of every
// cache line, memory and arithmetic taking turns: on a 7B-shaped layer (Zen 3, 2 threads, A/B
// in one session) rows one at a time took 23-27 ms for 5 rows against 47, 51 against 75 for 16,
// 1,254 against 1,275 for a 512-row chunk, and one row reads the weights at 0.8-1.0 of the copy
// bandwidth (12.5-13.4 ms against 23). Two rows at a time (16 accumulators, some spilled to L1)
// load each code vector and take its magnitude once for both: 2-16 rows 13-21% faster than one
// at a time (A/B in one process), one row unchanged. When only the first pass fetched the next
// span, memory idled while the later passes multiplied: sharing the fetch took 4-16 rows 4-13%
// faster (A/B in one process, float32 rows), 1-2 and 32-128 rows unchanged.
void rows_avx2(const uint8_t* a, int64_t lda, int64_t rows, const Panel& p, int32_t* total) {
  for (int64_t q0 = 0; q0 < p.quads; q0 += kRowSpanQuads) {
    const int64_t q1 = std::min(p.quads, q0 + kRowSpanQuads);
    const int64_t passes = (rows + 1) / 2;
    gemm_tile::row_tiles<2>(rows, [&](auto tile_rows, int64_t r) {
      constexpr int kRows = decltype(tile_rows)::value;
      const auto pass = passes == 1 ? row_avx2<kRows, false> : row_avx2<kRows, true>;
      pass(a + r * lda, lda, p, q0, q1, {r / 2, passes}, total + r * kPanelCols);
    });
  }
}
#endif

// Rows [0, rows) (at most kBlockRows) of the quantized x times one panel (AVX2: rows_avx2). The
// VNNI tile takes the panel by spans of kSpanQuads quads (128 KB of codes, in L2), every tile of
// rows over a span before the next: a tile streaming the whole panel would read it again from the
// outer caches or memory for each further tile (a 7B down projection's panel is 1.2 MB). The
// integer sums are exact, so spans change no bit. On a 7B-shaped layer (Zen 4, A/B in one
// process): 4-16 rows 8% faster, 32 rows 4%, a 512-row prompt chunk the same.
constexpr int64_t kSpanQuads = 512;
template <typename Out>
void panel_rows(const uint8_t* a, int64_t lda, const float* row_scale, int64_t rows,
                const Panel& p, Out* out, int64_t ldo, int64_t cols) {
#ifdef SGLANG_INT8_TILE
  alignas(64) int32_t total[kBlockRows * kPanelCols];
  std::fill(total, total + rows * kPanelCols, 0);
  for (int64_t q0 = 0; q0 < p.quads; q0 += kSpanQuads) {
    const int64_t q1 = std::min(p.quads, q0 + kSpanQuads);
    int64_t r = 0;
    for (; r + 6 <= rows; r += 6) tile6(a + r * lda, lda, p, q0, q1, total + r * kPanelCols);
    if (r < rows) {
      gemm_tile::row_tiles<3>(rows - r, [&](auto tile_rows, int64_t t) {
        tile<decltype(tile_rows)::value>(a + (r + t) * lda, lda, p, q0, q1,
                                         total + (r + t) * kPanelCols);
      });
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    store_row(total + r * kPanelCols, row_scale[r], p, out + r * ldo, cols);
#elif defined(SGLANG_INT8_AVX2)
  alignas(32) int32_t total[kBlockRows * kPanelCols];
  std::fill(total, total + rows * kPanelCols, 0);
  rows_avx2(a, lda, rows, p, total);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < std::min(kPanelCols, cols); ++c) {
      const float scale = row_scale[r] * p.scale[c];
      const float y = std::fma(static_cast<float>(total[r * kPanelCols + c]), scale, p.bias[c]);
      store_as(out + r * ldo + c, y);
    }
#else
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < std::min(kPanelCols, cols); ++c) {
      int32_t sum = 0;
      for (int64_t i = 0; i < 4 * p.quads; ++i)
        sum += static_cast<int32_t>(a[r * lda + i]) * p.codes[(i / 4) * kQuadBytes + 4 * c + i % 4];
      const float scale = row_scale[r] * p.scale[c];
      const float y = std::fma(static_cast<float>(sum - p.offset[c]), scale, p.bias[c]);
      store_as(out + r * ldo + c, y);
    }
#endif
}

// task(panel j, first row r0, rows) over every panel and block of at most kBlockRows rows; with
// one block (decode-sized) each thread streams one contiguous run of panels.
template <typename Task>
void for_each_block(int64_t panels, int64_t m, const Task& task) {
  const int64_t blocks = (m + kBlockRows - 1) / kBlockRows;
  auto run = [&](int64_t t) {
    const int64_t r0 = (t % blocks) * kBlockRows;
    task(t / blocks, r0, std::min(kBlockRows, m - r0));
  };
  if (blocks == 1) {
    at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) run(t);
    });
  } else {
    run_tasks(panels * blocks, [&](int64_t t, int64_t) { run(t); });
  }
}

// y (m, n) = x (m, k) quantized per row times the panels, T the element of both: bfloat16 bits
// (uint16_t) or float32.
template <typename T>
void multiply(const T* x, int64_t m, int64_t k, const int8_t* w, int64_t panels, int64_t quads,
              const int32_t* offset, const float* scale, const float* biases, T* y, int64_t n) {
  const int64_t lda = 4 * quads;
  std::vector<uint8_t> a(m * lda);
  std::vector<float> row_scales(m);
  quantize_rows(x, m, k, quads, a.data(), row_scales.data());
  for_each_block(panels, m, [&](int64_t j, int64_t r0, int64_t rows) {
    const int64_t c0 = j * kPanelCols;
    const Panel panel{w + j * quads * kQuadBytes, offset + c0, scale + c0, biases + c0, quads};
    panel_rows(a.data() + r0 * lda, lda, row_scales.data() + r0, rows, panel, y + r0 * n + c0, n,
               n - c0);
  });
}

// x (M, K) bfloat16 or float32, codes and offset from pack_int8_quads, scale float32 (panels *
// 64), bias (N) or None -> (M, N) in x's dtype. Float32 rows are quantized as they are (no
// rounding to bfloat16 first): a model served with float32 activations.
at::Tensor linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& offset,
                  const at::Tensor& scale, const c10::optional<at::Tensor>& bias, int64_t n) {
  const bool float32 = x.scalar_type() == at::kFloat;
  TORCH_CHECK(x.dim() == 2 && (float32 || x.scalar_type() == at::kBFloat16) && x.is_contiguous(),
              "x must be contiguous bfloat16 or float32 (rows, in)");
  TORCH_CHECK(codes.dim() == 4 && codes.scalar_type() == at::kChar && codes.is_contiguous() &&
                  codes.size(2) == kPanelCols && codes.size(3) == 4,
              "codes must be int8 (panels, quads, 64, 4)");
  const int64_t panels = codes.size(0), quads = codes.size(1), m = x.size(0), k = x.size(1);
  TORCH_CHECK(k <= 4 * quads && k > 4 * (quads - 1), "x has ", k, " inputs, the codes ",
              4 * quads);
  TORCH_CHECK(n > (panels - 1) * kPanelCols && n <= panels * kPanelCols,
              "n disagrees with the panels");
  for (const at::Tensor* t : {&offset, &scale})
    TORCH_CHECK(t->is_contiguous() && t->numel() == panels * kPanelCols,
                "offset and scale have one value per panel column");
  TORCH_CHECK(offset.scalar_type() == at::kInt && scale.scalar_type() == at::kFloat,
              "offset is int32, scale float32");
  auto out = at::empty({m, n}, x.options());
  if (m == 0) return out;
  const std::vector<float> biases = padded_bias(bias, panels, n);
  const int8_t* w = codes.data_ptr<int8_t>();
  const int32_t* offsets = offset.data_ptr<int32_t>();
  const float* scales = scale.data_ptr<float>();
  if (float32) {
    multiply(x.data_ptr<float>(), m, k, w, panels, quads, offsets, scales, biases.data(),
             out.data_ptr<float>(), n);
  } else {
    multiply(reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>()), m, k, w, panels,
             quads, offsets, scales, biases.data(),
             reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>()), n);
  }
  return out;
}


// ---- int4 weights: 8da4w-<group> -----------------------------------------------------------
// x quantized per row as above (p[r, k], sx[r]); W int4 per group of `group` inputs:
//   W[c, k] = s[c, g] q[c, k] + m[c, g], q in 0..15, g = k / group (quantized_linear.quantize_int4,
//   s and m bfloat16);
//   y[r, c] = fma(f[r, c], sx[r], b[c]), where f runs over the groups in order from 0:
//     f = fma(m[c, g], P[r, g], f), then f = fma(s[c, g], I[r, c, g], f),
//   with the exact integers P[r, g] = sum p[r, k] and I[r, c, g] = sum p[r, k] q[c, k] over the
//   group's inputs. Every path computes exactly these steps: the same bits on each, for any
//   batch or thread count.
//
// Layout (quantized_linear.pack_int4_octets): panels of 64 output columns, for each 32 inputs a
// 1 KB block: for each block of 8 columns (b) and octet of those inputs (o), 32 bytes, byte 4 e + i
// holding column 8 b + e's code of input 8 o + i in its low nibble and of input 8 o + 4 + i in
// its high one: (panels, in / 32, 8, 4, 32) uint8. One 32-byte load, a mask and a shift give two
// vpmaddubsw operands of 8 columns x 4 inputs, the codes the unsigned side, p the signed one (a
// pair's sum is at most 2 x 15 x 127, eight of them fit in 16 bits), so an AVX2 core needs about
// 8 instructions per 64 weights where the weight-only float path needs 20: decode reads the codes
// at the memory's speed (llama.cpp's Q4_0 x Q8_0 dot product works the same way, row by row).
constexpr int64_t kSubInputs = 32;
constexpr int64_t kSubBytes = kPanelCols * kSubInputs / 2;
constexpr int64_t kSpanSubs = 16;  // a row's pass over a panel: 16 KB of codes, in L1

struct Panel4 {
  const uint8_t* codes;   // (in / 32, 8, 4, 32)
  const uint16_t* scale;  // (groups, 64) bfloat16
  const uint16_t* low;    // (groups, 64) bfloat16
  int64_t subs;           // in / 32
  int64_t group_subs;     // group / 32
};

#ifdef SGLANG_INT4_AVX2
inline __m256 load8_bf16(const uint16_t* src) {
  const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

inline __m256i broadcast4(const int8_t* src) {
  int32_t quad;
  std::memcpy(&quad, src, sizeof(quad));
  return _mm256_set1_epi32(quad);
}

// kRows rows (signed codes p, ldp apart; group sums psum, `groups` apart) times a panel's 64
// columns over the 32-input blocks [s0, s1) (whole groups), into f (kRows, 64): two rows share
// each code vector's unpacking (a fifth fewer instructions per row than one at a time). With
// kFetchAhead, the codes a span further on are fetched. A VNNI build takes the products in 256-bit
// vpdpbusd straight into int32 (one instruction for vpmaddubsw, its 16-bit sum and vpmaddwd);
// one or two rows stream faster through this form than through the 512-bit one below.
template <int kRows, bool kFetchAhead>
void rows4_avx2(const int8_t* p, int64_t ldp, const int32_t* psum, int64_t groups,
                const Panel4& w, int64_t s0, int64_t s1, float* f) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  for (int64_t g0 = s0; g0 < s1; g0 += w.group_subs) {
    __m256i acc[kRows][8];
    for (int r = 0; r < kRows; ++r)
      for (int b = 0; b < 8; ++b) acc[r][b] = _mm256_setzero_si256();
    for (int64_t s = g0; s < g0 + w.group_subs; ++s) {
      const uint8_t* codes = w.codes + s * kSubBytes;
      for (int b = 0; b < 8; ++b) {
        if (kFetchAhead && s + kSpanSubs < w.subs) {
          const char* ahead = reinterpret_cast<const char*>(codes + kSpanSubs * kSubBytes);
          _mm_prefetch(ahead + 128 * b, _MM_HINT_T0);
          _mm_prefetch(ahead + 128 * b + 64, _MM_HINT_T0);
        }
#ifndef SGLANG_INT8_TILE
        __m256i sum[kRows];  // 16-bit pair sums, eight per lane at most
        for (int r = 0; r < kRows; ++r) sum[r] = _mm256_setzero_si256();
#endif
        for (int o = 0; o < 4; ++o) {
          const __m256i q =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 128 * b + 32 * o));
          const __m256i first = _mm256_and_si256(q, nibble);
          const __m256i second = _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble);
          for (int r = 0; r < kRows; ++r) {
            const int8_t* x = p + r * ldp + kSubInputs * s + 8 * o;
#ifdef SGLANG_INT8_TILE
            acc[r][b] = _mm256_dpbusd_epi32(acc[r][b], first, broadcast4(x));
            acc[r][b] = _mm256_dpbusd_epi32(acc[r][b], second, broadcast4(x + 4));
#else
            sum[r] = _mm256_add_epi16(sum[r], _mm256_maddubs_epi16(first, broadcast4(x)));
            sum[r] = _mm256_add_epi16(sum[r], _mm256_maddubs_epi16(second, broadcast4(x + 4)));
#endif
          }
        }
#ifndef SGLANG_INT8_TILE
        for (int r = 0; r < kRows; ++r)
          acc[r][b] = _mm256_add_epi32(acc[r][b], _mm256_madd_epi16(sum[r], _mm256_set1_epi16(1)));
#endif
      }
    }
    const int64_t g = g0 / w.group_subs;
    for (int r = 0; r < kRows; ++r) {
      const __m256 group_sum = _mm256_set1_ps(static_cast<float>(psum[r * groups + g]));
      for (int b = 0; b < 8; ++b) {
        float* out = f + r * kPanelCols + 8 * b;
        __m256 y = _mm256_loadu_ps(out);
        y = _mm256_fmadd_ps(load8_bf16(w.low + g * kPanelCols + 8 * b), group_sum, y);
        y = _mm256_fmadd_ps(load8_bf16(w.scale + g * kPanelCols + 8 * b),
                            _mm256_cvtepi32_ps(acc[r][b]), y);
        _mm256_storeu_ps(out, y);
      }
    }
  }
}
#endif

#ifdef SGLANG_INT8_TILE
// acc += codes (unsigned) . the signed quad at x broadcast to every lane: vpdpbusd with its
// broadcast from memory, in place (GCC's intrinsic neither folds the broadcast nor, once many
// accumulators are live, keeps them from being copied around each product).
inline void dpbusd_quad(__m512i& acc, __m512i codes, const int8_t* x) {
  asm("vpdpbusd %2%{1to16%}, %1, %0"
      : "+v"(acc)
      : "v"(codes), "m"(*reinterpret_cast<const int32_t*>(x)));
}

// The 512-bit VNNI form of rows4_avx2, for three rows and more: vpdpbusd takes the codes as its
// unsigned side and a quad of p, broadcast from memory, as the signed one, straight into int32.
// A vector holds one octet of 16 columns (two 8-column blocks, 128 bytes apart), so one
// accumulator per row covers 16 columns over a group, and up to 8 rows share each unpacking of
// the codes. 7B-shaped layer, Zen 5: 4 / 8 / 16 rows in 0.70 / 0.48 / 0.41 of the AVX2 passes'
// time. One or two rows, which read at the memory's speed, stream 1.2-1.4x slower through this
// form than through the 256-bit one, so they stay there.
template <int kRows, bool kFetchAhead>
void rows4_vnni(const int8_t* p, int64_t ldp, const int32_t* psum, int64_t groups,
                const Panel4& w, int64_t s0, int64_t s1, float* f) {
  // Two accumulators per row where there are few rows, so that the products do not wait on
  // vpdpbusd's latency.
  constexpr int kChains = kRows <= 4 ? 2 : 1;
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int64_t g0 = s0; g0 < s1; g0 += w.group_subs) {
    const int64_t g = g0 / w.group_subs;
    for (int pair = 0; pair < 4; ++pair) {  // columns 16 pair .. 16 pair + 15
      __m512i acc[kRows][kChains];
      for (int r = 0; r < kRows; ++r)
        for (int c = 0; c < kChains; ++c) acc[r][c] = _mm512_setzero_si512();
      for (int64_t s = g0; s < g0 + w.group_subs; ++s) {
        const uint8_t* codes = w.codes + s * kSubBytes + 256 * pair;
        if (kFetchAhead && s + kSpanSubs < w.subs) {
          const char* ahead = reinterpret_cast<const char*>(codes + kSpanSubs * kSubBytes);
          for (int line = 0; line < 4; ++line) _mm_prefetch(ahead + 64 * line, _MM_HINT_T0);
        }
        for (int o = 0; o < 4; ++o) {
          const __m512i q = _mm512_inserti64x4(
              _mm512_castsi256_si512(
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * o))),
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 128 + 32 * o)), 1);
          const __m512i first = _mm512_and_si512(q, nibble);
          const __m512i second = _mm512_and_si512(_mm512_srli_epi16(q, 4), nibble);
          for (int r = 0; r < kRows; ++r) {
            const int8_t* x = p + r * ldp + kSubInputs * s + 8 * o;
            dpbusd_quad(acc[r][(2 * o) % kChains], first, x);
            dpbusd_quad(acc[r][(2 * o + 1) % kChains], second, x + 4);
          }
        }
      }
      const __m512 scale = load16(w.scale + g * kPanelCols + 16 * pair, 16);
      const __m512 low = load16(w.low + g * kPanelCols + 16 * pair, 16);
      for (int r = 0; r < kRows; ++r) {
        float* out = f + r * kPanelCols + 16 * pair;
        __m512 y = _mm512_loadu_ps(out);
        y = _mm512_fmadd_ps(low, _mm512_set1_ps(static_cast<float>(psum[r * groups + g])), y);
        __m512i sum = acc[r][0];
        for (int c = 1; c < kChains; ++c) sum = _mm512_add_epi32(sum, acc[r][c]);
        y = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sum), y);
        _mm512_storeu_ps(out, y);
      }
    }
  }
}
#endif

// Rows [0, rows) times one panel into f (rows, 64), as rows_avx2 takes them: by spans of
// kSpanSubs blocks, two rows at a time (eight in the 512-bit form), the first pass fetching the
// next span, the other rows reading it from L1.
void panel_rows4(const int8_t* p, int64_t ldp, const int32_t* psum, int64_t groups, int64_t rows,
                 const Panel4& w, float* f) {
#ifdef SGLANG_INT4_AVX2
  for (int64_t s0 = 0; s0 < w.subs; s0 += kSpanSubs) {
    const int64_t s1 = std::min(w.subs, s0 + kSpanSubs);  // kSpanSubs is whole groups
#ifdef SGLANG_INT8_TILE
    if (rows > 2) {
      gemm_tile::row_tiles<8>(rows, [&](auto tile_rows, int64_t r) {
        constexpr int kRows = decltype(tile_rows)::value;
        const auto pass = r == 0 ? rows4_vnni<kRows, true> : rows4_vnni<kRows, false>;
        pass(p + r * ldp, ldp, psum + r * groups, groups, w, s0, s1, f + r * kPanelCols);
      });
      continue;
    }
#endif
    gemm_tile::row_tiles<2>(rows, [&](auto tile_rows, int64_t r) {
      constexpr int kRows = decltype(tile_rows)::value;
      const auto pass = r == 0 ? rows4_avx2<kRows, true> : rows4_avx2<kRows, false>;
      pass(p + r * ldp, ldp, psum + r * groups, groups, w, s0, s1, f + r * kPanelCols);
    });
  }
#else
  const int64_t group = w.group_subs * kSubInputs;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < kPanelCols; ++c) {
      const uint8_t* column = w.codes + (c / 8) * 128 + 4 * (c % 8);
      float y = 0.f;
      for (int64_t g = 0; g < groups; ++g) {
        int32_t sum = 0;
        for (int64_t k = g * group; k < (g + 1) * group; ++k) {
          const int64_t within = k % kSubInputs, o = within / 8, i = within % 8;
          const uint8_t byte = column[(k / kSubInputs) * kSubBytes + 32 * o + i % 4];
          sum += static_cast<int32_t>(p[r * ldp + k]) * (i < 4 ? byte & 0x0F : byte >> 4);
        }
        y = std::fma(to_float(w.low[g * kPanelCols + c]), static_cast<float>(psum[r * groups + g]),
                     y);
        y = std::fma(to_float(w.scale[g * kPanelCols + c]), static_cast<float>(sum), y);
      }
      f[r * kPanelCols + c] = y;
    }
#endif
}

// A row's codes p + 128 -> p (two's complement) in place, and the sum of p over each group of
// `group` inputs. Raw, unaliased pointers: the byte stores would otherwise make the compiler
// reload a container's data pointer at every element instead of vectorizing the loop.
void to_signed(uint8_t* __restrict codes, int64_t k, int64_t group, int32_t* __restrict sums) {
  for (int64_t g = 0; g < k / group; ++g) {
    uint8_t* __restrict c = codes + g * group;
    int32_t sum = 0;
    for (int64_t i = 0; i < group; ++i) {
      sum += c[i];
      c[i] ^= 0x80;
    }
    sums[g] = sum - 128 * static_cast<int32_t>(group);
  }
}

template <typename T>
void multiply_int4(const T* x, int64_t m, int64_t k, int64_t group, const uint8_t* codes,
                   int64_t panels, const uint16_t* scale, const uint16_t* low,
                   const float* biases, T* y, int64_t n) {
  const int64_t quads = k / 4, groups = k / group;
  std::vector<uint8_t> a(m * k);
  std::vector<float> row_scales(m);
  quantize_rows(x, m, k, quads, a.data(), row_scales.data());
  std::vector<int32_t> psum(m * groups);  // the signed codes' sum per row and group
  uint8_t* rows_codes = a.data();
  int32_t* sums = psum.data();
  at::parallel_for(0, m, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      to_signed(rows_codes + r * k, k, group, sums + r * groups);
  });
  const auto* p = reinterpret_cast<const int8_t*>(a.data());
  for_each_block(panels, m, [&](int64_t j, int64_t r0, int64_t rows) {
    const int64_t c0 = j * kPanelCols;
    const Panel4 panel{codes + j * (k / kSubInputs) * kSubBytes, scale + j * groups * kPanelCols,
                       low + j * groups * kPanelCols, k / kSubInputs, group / kSubInputs};
    alignas(32) float f[kBlockRows * kPanelCols];
    std::fill(f, f + rows * kPanelCols, 0.f);
    panel_rows4(p + r0 * k, k, psum.data() + r0 * groups, groups, rows, panel, f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < std::min(kPanelCols, n - c0); ++c)
        store_as(y + (r0 + r) * n + c0 + c,
                 std::fma(f[r * kPanelCols + c], row_scales[r0 + r], biases[c0 + c]));
  });
}

// x (M, K) bfloat16 or float32, K a multiple of `group` (32, 64, 128 or 256); codes uint8
// (panels, K / 32, 8, 4, 32) and scale, min bfloat16 (panels, K / group, 64) from
// pack_int4_octets; bias (N) or None -> (M, N) in x's dtype.
at::Tensor linear_int4(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale,
                       const at::Tensor& low, int64_t group, const c10::optional<at::Tensor>& bias,
                       int64_t n) {
  const bool float32 = x.scalar_type() == at::kFloat;
  TORCH_CHECK(x.dim() == 2 && (float32 || x.scalar_type() == at::kBFloat16) && x.is_contiguous(),
              "x must be contiguous bfloat16 or float32 (rows, in)");
  TORCH_CHECK(group % kSubInputs == 0 && group > 0 && group <= 256, "group must be 32, 64, ..");
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(k % group == 0 && k > 0, "x has ", k, " inputs, not whole groups of ", group);
  TORCH_CHECK(codes.dim() == 5 && codes.scalar_type() == at::kByte && codes.is_contiguous() &&
                  codes.size(1) == k / kSubInputs && codes.size(2) == 8 && codes.size(3) == 4 &&
                  codes.size(4) == 32,
              "codes must be uint8 (panels, in / 32, 8, 4, 32)");
  const int64_t panels = codes.size(0);
  TORCH_CHECK(n > (panels - 1) * kPanelCols && n <= panels * kPanelCols,
              "n disagrees with the panels");
  for (const at::Tensor* t : {&scale, &low})
    TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->is_contiguous() &&
                    t->numel() == panels * (k / group) * kPanelCols,
                "scale and min must be bfloat16 (panels, in / group, 64)");
  auto out = at::empty({m, n}, x.options());
  if (m == 0) return out;
  const std::vector<float> biases = padded_bias(bias, panels, n);
  const auto* scales = reinterpret_cast<const uint16_t*>(scale.data_ptr<c10::BFloat16>());
  const auto* lows = reinterpret_cast<const uint16_t*>(low.data_ptr<c10::BFloat16>());
  const uint8_t* w = codes.data_ptr<uint8_t>();
  if (float32) {
    multiply_int4(x.data_ptr<float>(), m, k, group, w, panels, scales, lows, biases.data(),
                  out.data_ptr<float>(), n);
  } else {
    multiply_int4(reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>()), m, k, group, w,
                  panels, scales, lows, biases.data(),
                  reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>()), n);
  }
  return out;
}

// The instruction's own rate, the int8 peak that MFU is counted against: on every thread,
// kPeakChains independent vpdpbusd chains in registers (no product waits for another) for about
// `seconds`; operations per second over all threads, a multiply-add counted as two (128 per
// instruction). 0 where this build has no VNNI path.
constexpr int kPeakChains = 12;

double peak_ops(double seconds) {
#ifdef SGLANG_INT8_TILE
  const int threads = at::get_num_threads();
  std::vector<double> rates(threads, 0.0);
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      __m512i acc[kPeakChains];
      for (int c = 0; c < kPeakChains; ++c) acc[c] = _mm512_setzero_si512();
      const __m512i x = _mm512_set1_epi8(1), w = _mm512_set1_epi8(2);
      const auto start = std::chrono::steady_clock::now();
      int64_t rounds = 0;
      double elapsed = 0.0;
      do {
        for (int i = 0; i < 4096; ++i) {
#pragma GCC unroll 12
          for (int c = 0; c < kPeakChains; ++c)
            asm volatile("vpdpbusd %2, %1, %0" : "+v"(acc[c]) : "v"(x), "v"(w));
        }
        rounds += 4096;
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      } while (elapsed < seconds);
      int32_t sink[16];
      __m512i total = acc[0];
      for (int c = 1; c < kPeakChains; ++c) total = _mm512_add_epi32(total, acc[c]);
      _mm512_storeu_si512(sink, total);
      volatile int32_t keep = sink[0];
      (void)keep;
      rates[t] = static_cast<double>(rounds) * kPeakChains * 128 / elapsed;
    }
  });
  double total = 0.0;
  for (double rate : rates) total += rate;
  return total;
#elif defined(SGLANG_INT8_AVX2)
  // The AVX2 product's own chain (vpmaddubsw, vpmaddwd, vpaddd: 32 multiply-adds), kPeakChains
  // of them independent, operations per second over all threads.
  const int threads = at::get_num_threads();
  std::vector<double> rates(threads, 0.0);
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      __m256i acc[kPeakChains];
      for (int c = 0; c < kPeakChains; ++c) acc[c] = _mm256_setzero_si256();
      const __m256i x = _mm256_set1_epi8(1), w = _mm256_set1_epi8(2), ones = _mm256_set1_epi16(1);
      const auto start = std::chrono::steady_clock::now();
      int64_t rounds = 0;
      double elapsed = 0.0;
      do {
        for (int i = 0; i < 4096; ++i) {
#pragma GCC unroll 12
          for (int c = 0; c < kPeakChains; ++c) {
            __m256i s;  // one product per chain and round (asm: the compiler cannot hoist it)
            asm volatile("vpmaddubsw %2, %1, %0" : "=x"(s) : "x"(x), "x"(w));
            acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(s, ones));
          }
        }
        rounds += 4096;
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      } while (elapsed < seconds);
      alignas(32) int32_t sink[8];
      __m256i total = acc[0];
      for (int c = 1; c < kPeakChains; ++c) total = _mm256_add_epi32(total, acc[c]);
      _mm256_store_si256(reinterpret_cast<__m256i*>(sink), total);
      volatile int32_t keep = sink[0];
      (void)keep;
      rates[t] = static_cast<double>(rounds) * kPeakChains * 64 / elapsed;
    }
  });
  double total = 0.0;
  for (double rate : rates) total += rate;
  return total;
#else
  (void)seconds;
  return 0.0;
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("peak_ops", &peak_ops,
        "the int8 product's rate on every thread (vpdpbusd, or AVX2's vpmaddubsw chain; int8 "
        "operations per second; 0 for the portable build)",
        py::arg("seconds") = 0.5);
  m.def("isa", [] { return SGLANG_COMPILED_ISA; }, "The instruction set of this build");
  m.def("linear", &linear,
        "x quantized per row times W int8 per channel, in integers; plus bias -> (M, N)",
        py::arg("x"), py::arg("codes"), py::arg("offset"), py::arg("scale"), py::arg("bias"),
        py::arg("n"));
  m.def("linear_int4", &linear_int4,
        "x quantized per row times W int4 per group, in integers; plus bias -> (M, N)",
        py::arg("x"), py::arg("codes"), py::arg("scale"), py::arg("min"), py::arg("group"),
        py::arg("bias"), py::arg("n"));
  m.def("int4_isa", [] {
#if defined(SGLANG_INT8_TILE)
    return "avx512_vnni";
#elif defined(SGLANG_INT4_AVX2)
    return "avx2";
#else
    return "portable";
#endif
  }, "The instruction set of this build's int4 path");
}
