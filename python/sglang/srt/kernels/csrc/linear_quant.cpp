// Weight-only quantized linears on a CPU: y = x W^T (+ b) for bfloat16 x and int8 or int4 W,
// both stored in the native GEMM's panel order (gemm_bf16.cpp, gemm_tile.h: panels of 64 output
// columns, for each pair of inputs the two weights of a column side by side) and run on its
// tile at every row count: the codes become exact bfloat16 in registers as they stream, tile by
// tile over spans of the panel that stay in L1, so a row's outputs are the same bits whatever
// the batch, decode step or prompt chunk. Scales (and int4's mins) are applied to float32 sums,
// never to the weights: no weight is ever rounded to bfloat16. Sums are float32 in a fixed order
// per output: results depend neither on the batch nor on the thread count. Without AVX512-BF16
// a portable loop computes the same sums.

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>  // bindings only (torch/extension.h builds twice as long)

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "gemm_tile.h"
#include "linear_quant_avx2.h"
#include "panel_bias.h"
#include "run_tasks.h"

#ifdef SGLANG_GEMM_TILE
#define SGLANG_COMPILED_ISA "avx512_bf16"
#elif defined(SGLANG_QUANT_AVX2)
#define SGLANG_COMPILED_ISA "avx2"
#else
#define SGLANG_COMPILED_ISA "portable"
#endif

namespace {

using gemm_tile::kPanelCols;

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// x and y are bfloat16 (their bits: uint16_t) or, on builds without the AVX512-BF16 tile, also
// float32: a CPU without native bfloat16 serves quantized models with float32 activations.
#ifdef SGLANG_GEMM_TILE
constexpr bool kTakesFloat32 = false;
#else
constexpr bool kTakesFloat32 = true;
#endif
inline float to_float(uint16_t v) { return bf16_to_float(v); }
inline float to_float(float v) { return v; }
inline void store_as(uint16_t* y, float v) { *y = c10::BFloat16(v).x; }
inline void store_as(float* y, float v) { *y = v; }

// x against a weight of k inputs in `panels` panels standing for n outputs.
void check_x(const at::Tensor& x, int64_t k, int64_t n, int64_t panels) {
  const bool dtype_ok = x.scalar_type() == at::kBFloat16 ||
                        (kTakesFloat32 && x.scalar_type() == at::kFloat);
  TORCH_CHECK(x.dim() == 2 && dtype_ok && x.is_contiguous(),
              kTakesFloat32 ? "x must be contiguous bfloat16 or float32 (rows, in)"
                            : "x must be contiguous bfloat16 (rows, in)");
  TORCH_CHECK(x.size(1) == k, "x has ", x.size(1), " inputs, the weight ", k);
  TORCH_CHECK(n > (panels - 1) * kPanelCols && n <= panels * kPanelCols,
              "n disagrees with the panels");
}

#ifdef SGLANG_GEMM_TILE
// Rows go over each panel by spans of kSpanPairs input pairs (16 KB of int8 codes, in L1), every
// tile of rows over a span in turn: the codes come from memory once, each tile converting them
// in registers, and a tile's sums pass through `total` (64 float32 per row) between spans
// unchanged: the same float32 sums in the same order, whatever the number of rows. Converting
// each panel once into a bfloat16 buffer for all the tiles, instead, was 5-30% slower at 16-512
// rows (a 7B down projection's panel is 2.4 MB of bfloat16, out of L2), and so was converting
// each span once into an L1 buffer at 8-16 rows (the tiles then load every weight vector once
// per row). The codes' loop fetches them kFetchAhead bytes further on: the hardware's
// prefetcher alone left a 7B-shaped layer's int4 at 2-4 rows waiting on memory (0.6 of the time
// with it).
constexpr int64_t kSpanPairs = 128;
constexpr int64_t kFetchAhead = 16384;
constexpr int64_t kBlockRows = 512;  // rows per task: their totals (128 KB) stay in L2

inline void fetch_ahead(const void* codes) {
  _mm_prefetch(static_cast<const char*>(codes) + kFetchAhead, _MM_HINT_T0);
}

// Every panel on the threads, rows by blocks of kBlockRows: rows(j, r0, count, total) multiplies
// rows [r0, r0 + count) by panel j, total a worker's scratch for count x 64 float32. One block
// (decode steps, most prompt chunks): each thread takes one contiguous run of panels, a single
// sequential stream of the codes (taking panels in turn across threads read a 7B-shaped layer's
// int4 codes at ~0.8 of the rate); more: tasks (panel, block) from a shared counter, panel by
// panel.
template <typename Rows>
void run_panels(int64_t panels, int64_t m, const Rows& rows) {
  const int64_t blocks = (m + kBlockRows - 1) / kBlockRows;
  if (blocks == 1) {
    at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> total(m * kPanelCols);
      for (int64_t j = begin; j < end; ++j) rows(j, 0, m, total.data());
    });
    return;
  }
  std::vector<std::vector<float>> scratch(at::get_num_threads(),
                                          std::vector<float>(kBlockRows * kPanelCols));
  run_tasks(panels * blocks, [&](int64_t t, int64_t worker) {
    const int64_t j = t / blocks, r0 = (t % blocks) * kBlockRows;
    rows(j, r0, std::min(kBlockRows, m - r0), scratch[worker].data());
  });
}
#endif

// int8, in the native GEMM's panel order: q int8 (panels, pairs, 64, 2), pairs = in / 2
// rounded up: panel j holds output columns [64 j, 64 j + 64), for each pair of inputs
// (2p, 2p + 1) the two codes of a column side by side (gemm_bf16.cpp's order); codes past the
// weight's out or in are 0. scale float32 (panels * 64), 0 past out. y[c] = bfloat16(scale[c] *
// sum_k q[c, k] x[k] + b[c]): the codes are exact in bfloat16, the sum is float32 over the pairs
// in turn, the scale applied once. Rows are taken 1-7 at a time by the GEMM's tile, the codes
// converted in registers as they stream.
constexpr int64_t kPairBytes = 2 * kPanelCols;

#ifdef SGLANG_GEMM_TILE
// Pair p's 128 codes as the four bfloat16 vectors of gemm_bf16's panel (int8 -> float32 ->
// bfloat16, exact).
inline void code_pair(const int8_t* src, __m512bh* w) {
  for (int v = 0; v < 4; ++v) {
    const __m128i* at = reinterpret_cast<const __m128i*>(src + 32 * v);
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(at)));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(at + 1)));
    w[v] = _mm512_cvtne2ps_pbh(hi, lo);
  }
}

// Rows [0, R): total (R x 64 float32) += their products with the panel's pairs [p0, p1).
template <int R>
void int8_span(const uint16_t* a, int64_t lda, const int8_t* panel, int64_t p0, int64_t p1,
               float* total) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_loadu_ps(total + r * kPanelCols + 16 * v);
  if (p1 <= p0) __builtin_unreachable();  // keeps the accumulators out of stack slots
  for (int64_t p = p0; p < p1; ++p) {
    const int8_t* src = panel + p * kPairBytes;
    fetch_ahead(src);
    fetch_ahead(src + 64);
    __m512bh w[4];
    code_pair(src, w);
    gemm_tile::multiply_pair<R>(acc, a, lda, p, w);
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) _mm512_storeu_ps(total + r * kPanelCols + 16 * v, acc[r][v]);
}

// Rows [0, rows) x one panel, by spans: out = bfloat16(scale total + bias).
void int8_rows(const uint16_t* x, int64_t lda, int64_t rows, const int8_t* panel, int64_t pairs,
               const float* scale, const float* bias, float* total, uint16_t* out, int64_t ldo,
               int64_t cols) {
  std::fill(total, total + rows * kPanelCols, 0.f);
  for (int64_t p0 = 0; p0 < pairs; p0 += kSpanPairs) {
    const int64_t p1 = std::min(pairs, p0 + kSpanPairs);
    gemm_tile::row_tiles<gemm_tile::kTileRows>(rows, [&](auto tile_rows, int64_t r) {
      int8_span<decltype(tile_rows)::value>(x + r * lda, lda, panel, p0, p1,
                                            total + r * kPanelCols);
    });
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int v = 0; v < 4; ++v) {
      const __m512 y = _mm512_fmadd_ps(_mm512_loadu_ps(total + r * kPanelCols + 16 * v),
                                       _mm512_loadu_ps(scale + 16 * v),
                                       _mm512_loadu_ps(bias + 16 * v));
      gemm_tile::store16(y, out + r * ldo + 16 * v, cols - 16 * v);
    }
}
#endif

// y (m, n) = x (m, 2 pairs) times the int8 panels (see linear_int8); T: uint16_t (bfloat16) or
// float (builds with kTakesFloat32).
template <typename T>
void int8_product(const T* a, int64_t m, const int8_t* codes, const float* scales,
                  const std::vector<float>& biases, int64_t panels, int64_t pairs, T* y,
                  int64_t n) {
  const int64_t k = 2 * pairs;
#ifdef SGLANG_GEMM_TILE
  if constexpr (!std::is_same_v<T, uint16_t>) {
    TORCH_CHECK(false, "this build takes bfloat16 x only");
  } else {
  run_panels(panels, m, [&](int64_t j, int64_t r0, int64_t rows, float* total) {
    const int64_t c0 = j * kPanelCols;
    int8_rows(a + r0 * k, k, rows, codes + j * pairs * kPairBytes, pairs, scales + c0,
              biases.data() + c0, total, y + r0 * n + c0, n, n - c0);
  });
  }
#elif defined(SGLANG_QUANT_AVX2)
  std::vector<float> widened;
  const float* xf = quant_avx2::as_float(a, m, k, widened);
  auto panel = [&](auto product) {
    return [&, product](int64_t j, int64_t r, int64_t rows) {
      const int64_t c0 = j * kPanelCols;
      product(xf + r * k, k, rows, codes + j * pairs * kPairBytes, pairs, scales + c0,
              biases.data() + c0, y + r * n + c0, n, n - c0);
    };
  };
  quant_avx2::run(panels, m, panel(quant_avx2::int8_panel<T>),
                  panel(quant_avx2::int8_panel_buffered<T>));
#else
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j)
      for (int64_t c = 0; c < std::min(kPanelCols, n - j * kPanelCols); ++c) {
        const int64_t col = j * kPanelCols + c;
        for (int64_t r = 0; r < m; ++r) {
          float sum = 0.f;
          for (int64_t p = 0; p < pairs; ++p)
            for (int t = 0; t < 2; ++t)
              sum += static_cast<float>(codes[(j * pairs + p) * kPairBytes + 2 * c + t]) *
                     to_float(a[r * k + 2 * p + t]);
          store_as(y + r * n + col, std::fma(sum, scales[col], biases[col]));
        }
      }
  });
#endif
}

at::Tensor linear_int8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                       const c10::optional<at::Tensor>& bias, int64_t n) {
  TORCH_CHECK(q.dim() == 4 && q.scalar_type() == at::kChar && q.is_contiguous() &&
                  q.size(2) == kPanelCols && q.size(3) == 2,
              "q must be contiguous int8 (panels, pairs, 64, 2)");
  const int64_t panels = q.size(0), pairs = q.size(1), k = 2 * pairs;
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() &&
                  scale.numel() == panels * kPanelCols,
              "scale must be float32 (panels * 64)");
  check_x(x, k, n, panels);
  const int64_t m = x.size(0);
  auto out = at::empty({m, n}, x.options());
  if (m == 0) return out;
  const std::vector<float> biases = padded_bias(bias, panels, n);
  const auto* codes = q.data_ptr<int8_t>();
  const float* scales = scale.data_ptr<float>();
  if (x.scalar_type() == at::kFloat) {
    int8_product(x.data_ptr<float>(), m, codes, scales, biases, panels, pairs,
                 out.data_ptr<float>(), n);
  } else {
    int8_product(reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>()), m, codes, scales,
                 biases, panels, pairs, reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>()),
                 n);
  }
  return out;
}


// int4, per group of `group` inputs (asymmetric): q uint8 (panels, pairs, 64): the 64 bytes of
// pair p of a panel are 16 little-endian 32-bit words; word l holds the codes of the columns
// 16 v + l (v = 0..3): input 2 p in bits 4 v .. 4 v + 3, input 2 p + 1 in bits 16 + 4 v ...
// A word shifted right by 4 v and masked with 0x000F000F therefore holds column 16 v + l's two
// codes in the bfloat16 pair order, and OR-ing in 0x43004300 makes them the exact bfloat16 of
// 128 + code (bfloat16 steps by 1 in [128, 256)): one shift and one ternary-logic op per
// vector, no shuffles. The sums run over x (128 + q), and 128 times the group's input sum is
// taken off once per group. scale and min (panels, groups, 64), both bfloat16 (quantized here)
// or both float32 (a published checkpoint's float16 scales and integer zero points, exactly:
// min = -scale * zero). W[c, k] = scale[c, g]
// * q[c, k] + min[c, g], g = k / group, applied per group to float32 sums: y[c] = sum_g
// (scale[c, g] * (sum_{k in g} (128 + q[c, k]) x[k] - 128 sum_{k in g} x[k]) + min[c, g] *
// sum_{k in g} x[k]) + b[c]. Codes, scales and mins past the weight's out are 0.
constexpr int kInt4TileRows = 6;  // the group's sums stay in 24 registers

void check_int4(const at::Tensor& q, const at::Tensor& scale, const at::Tensor& min,
                int64_t group) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kByte && q.is_contiguous() &&
                  q.size(2) == kPanelCols,
              "q must be contiguous uint8 (panels, pairs, 64)");
  const int64_t k = 2 * q.size(1);
  TORCH_CHECK(group % 2 == 0 && group > 0 && k % group == 0,
              "int4: in (", k, ") must be a multiple of the group (", group, ")");
  TORCH_CHECK(scale.scalar_type() == min.scalar_type() &&
                  (scale.scalar_type() == at::kBFloat16 || scale.scalar_type() == at::kFloat),
              "scale and min must be both bfloat16 or both float32");
  for (const at::Tensor* t : {&scale, &min})
    TORCH_CHECK(t->is_contiguous() && t->dim() == 3 && t->size(0) == q.size(0) &&
                    t->size(1) == k / group && t->size(2) == kPanelCols,
                "scale and min must be (panels, in / group, 64)");
}

// Per row of x, the float32 sum of each group's inputs (in order).
template <typename T>
std::vector<float> group_sums(const T* x, int64_t m, int64_t k, int64_t group) {
  const int64_t groups = k / group;
  std::vector<float> sums(m * groups);
  at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        float sum = 0.f;
        for (int64_t i = g * group; i < (g + 1) * group; ++i) sum += to_float(x[r * k + i]);
        sums[r * groups + g] = sum;
      }
  });
  return sums;
}

#ifdef SGLANG_GEMM_TILE
// Pair p's 128 codes (64 bytes) as the four bfloat16 vectors of the GEMM's panel, each value
// 128 + code (exact).
inline void nibble_pair(const uint8_t* src, __m512bh* w) {
  const __m512i words = _mm512_loadu_si512(src);
  const __m512i mask = _mm512_set1_epi32(0x000F000F), bias = _mm512_set1_epi32(0x43004300);
  constexpr int kMaskThenOr = 0xEA;  // (a & b) | c
  w[0] = (__m512bh)_mm512_ternarylogic_epi32(words, mask, bias, kMaskThenOr);
  w[1] = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi32(words, 4), mask, bias, kMaskThenOr);
  w[2] = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi32(words, 8), mask, bias, kMaskThenOr);
  w[3] = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi32(words, 12), mask, bias,
                                             kMaskThenOr);
}

// 16 scales or mins as float32: bfloat16 (uint16_t) widened, or float32 as they are.
inline __m512 load16(const uint16_t* p) {
  return _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

template <typename Scale>
struct Int4Panel {
  const uint8_t* codes;  // this panel's codes
  const Scale* scale;  // (groups, 64)
  const Scale* min;
  int64_t group_pairs;
};

// Rows [0, R) x one panel's groups [g0, g1): per group, the codes' sums in registers, then the
// group's offset taken off and its scale and min applied to the running totals (total, R x 64
// float32, touched once per group).
template <int R, typename Scale>
void int4_groups(const uint16_t* a, int64_t lda, const Int4Panel<Scale>& p, const float* sums,
                 int64_t groups, int64_t g0, int64_t g1, float* total) {
  for (int64_t g = g0; g < g1; ++g) {
    __m512 acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_setzero_ps();
    for (int64_t i = g * p.group_pairs; i < (g + 1) * p.group_pairs; ++i) {
      const uint8_t* src = p.codes + i * kPanelCols;
      fetch_ahead(src);
      __m512bh w[4];
      nibble_pair(src, w);
      gemm_tile::multiply_pair<R>(acc, a, lda, i, w);
    }
    for (int v = 0; v < 4; ++v) {
      const __m512 s = load16(p.scale + g * kPanelCols + 16 * v);
      const __m512 lo = load16(p.min + g * kPanelCols + 16 * v);
      for (int r = 0; r < R; ++r) {
        const float sum = sums[r * groups + g];
        __m512 t = _mm512_loadu_ps(total + r * kPanelCols + 16 * v);
        t = _mm512_fmadd_ps(_mm512_sub_ps(acc[r][v], _mm512_set1_ps(128.f * sum)), s, t);
        t = _mm512_fmadd_ps(lo, _mm512_set1_ps(sum), t);
        _mm512_storeu_ps(total + r * kPanelCols + 16 * v, t);
      }
    }
  }
}

// Rows [0, rows) x one panel, by spans of whole groups (kSpanPairs pairs, or one group where a
// group is longer): out = bfloat16(total + bias).
template <typename Scale>
void int4_rows(const uint16_t* x, int64_t lda, int64_t rows, const Int4Panel<Scale>& p,
               const float* sums, int64_t groups, const float* bias, float* total, uint16_t* out,
               int64_t ldo, int64_t cols) {
  std::fill(total, total + rows * kPanelCols, 0.f);
  const int64_t span_groups = std::max<int64_t>(1, kSpanPairs / p.group_pairs);
  for (int64_t g0 = 0; g0 < groups; g0 += span_groups) {
    const int64_t g1 = std::min(groups, g0 + span_groups);
    gemm_tile::row_tiles<kInt4TileRows>(rows, [&](auto tile_rows, int64_t r) {
      int4_groups<decltype(tile_rows)::value>(x + r * lda, lda, p, sums + r * groups, groups, g0,
                                              g1, total + r * kPanelCols);
    });
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int v = 0; v < 4; ++v) {
      const __m512 y = _mm512_add_ps(_mm512_loadu_ps(total + r * kPanelCols + 16 * v),
                                     _mm512_loadu_ps(bias + 16 * v));
      gemm_tile::store16(y, out + r * ldo + 16 * v, cols - 16 * v);
    }
}
#endif

template <typename Scale>
inline float scale_at(const Scale* p, int64_t at) {
  if constexpr (sizeof(Scale) == 2) return bf16_to_float(p[at]);
  else return p[at];
}

template <typename T, typename Scale>
void int4_product(const T* a, int64_t m, int64_t k, const uint8_t* codes,
                  const Scale* scales, const Scale* mins, int64_t panels, int64_t group,
                  const std::vector<float>& biases, T* y, int64_t n) {
  const int64_t pairs = k / 2, groups = k / group;
  const std::vector<float> sums = group_sums(a, m, k, group);
#ifdef SGLANG_GEMM_TILE
  if constexpr (!std::is_same_v<T, uint16_t>) {
    TORCH_CHECK(false, "this build takes bfloat16 x only");
  } else {
  run_panels(panels, m, [&](int64_t j, int64_t r0, int64_t rows, float* total) {
    const int64_t c0 = j * kPanelCols;
    const Int4Panel<Scale> panel{codes + j * pairs * kPanelCols, scales + j * groups * kPanelCols,
                                 mins + j * groups * kPanelCols, group / 2};
    int4_rows(a + r0 * k, k, rows, panel, sums.data() + r0 * groups, groups, biases.data() + c0,
              total, y + r0 * n + c0, n, n - c0);
  });
  }
#elif defined(SGLANG_QUANT_AVX2)
  std::vector<float> widened;
  const float* xf = quant_avx2::as_float(a, m, k, widened);
  auto panel = [&](auto product) {
    return [&, product](int64_t j, int64_t r, int64_t rows) {
      const int64_t c0 = j * kPanelCols;
      product(xf + r * k, k, rows, codes + j * pairs * kPanelCols, pairs, group,
              scales + j * groups * kPanelCols, mins + j * groups * kPanelCols,
              sums.data() + r * groups, biases.data() + c0, y + r * n + c0, n, n - c0);
    };
  };
  quant_avx2::run(panels, m, panel(quant_avx2::int4_panel<Scale, T>),
                  panel(quant_avx2::int4_panel_buffered<Scale, T>));
#else
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j)
      for (int64_t c = 0; c < std::min(kPanelCols, n - j * kPanelCols); ++c) {
        const int64_t col = j * kPanelCols + c;
        const int64_t vector = c / 16, lane = c % 16;
        for (int64_t r = 0; r < m; ++r) {
          float total = 0.f;
          for (int64_t g = 0; g < groups; ++g) {
            float sum = 0.f;
            for (int64_t i = g * group / 2; i < (g + 1) * group / 2; ++i)
              for (int t = 0; t < 2; ++t) {
                const uint8_t byte =
                    codes[(j * pairs + i) * kPanelCols + 4 * lane + 2 * t + vector / 2];
                const int code = vector % 2 ? byte >> 4 : byte & 0x0F;
                sum += static_cast<float>(128 + code) * to_float(a[r * k + 2 * i + t]);
              }
            sum -= 128.f * sums[r * groups + g];
            const int64_t at = (j * groups + g) * kPanelCols + c;
            total = std::fma(sum, scale_at(scales, at), total);
            total = std::fma(scale_at(mins, at), sums[r * groups + g], total);
          }
          store_as(y + r * n + col, total + biases[col]);
        }
      }
  });
#endif
}

at::Tensor linear_int4(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                       const at::Tensor& min, int64_t group,
                       const c10::optional<at::Tensor>& bias, int64_t n) {
  check_int4(q, scale, min, group);
  const int64_t panels = q.size(0), k = 2 * q.size(1);
  check_x(x, k, n, panels);
  const int64_t m = x.size(0);
  auto out = at::empty({m, n}, x.options());
  if (m == 0) return out;
  const std::vector<float> biases = padded_bias(bias, panels, n);
  const auto* codes = q.data_ptr<uint8_t>();
  auto product = [&](auto* a, auto* y) {
    if (scale.scalar_type() == at::kFloat) {
      int4_product(a, m, k, codes, scale.data_ptr<float>(), min.data_ptr<float>(), panels, group,
                   biases, y, n);
    } else {
      int4_product(a, m, k, codes, reinterpret_cast<const uint16_t*>(scale.data_ptr()),
                   reinterpret_cast<const uint16_t*>(min.data_ptr()), panels, group, biases, y, n);
    }
  };
  if (x.scalar_type() == at::kFloat) {
    product(static_cast<const float*>(x.data_ptr<float>()), out.data_ptr<float>());
  } else {
    product(reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>()),
            reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>()));
  }
  return out;
}

// Round-to-nearest quantizers, rows in parallel: the same codes, scales and mins as
// quantized_linear's torch definitions (float32 division, round half to even, bfloat16 by
// round to nearest even), without torch's float32 copy of the weight and its passes over it.
template <typename T>
inline float element(const T* w, int64_t i) {
  if constexpr (std::is_same_v<T, float>) return w[i];
  else return bf16_to_float(w[i]);
}

template <typename T>
void quantize_rows_int8(const T* w, int64_t rows, int64_t k, int8_t* q, float* scale) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float low = element(w, r * k), high = low;
      for (int64_t i = 1; i < k; ++i) {
        const float v = element(w, r * k + i);
        low = std::min(low, v);
        high = std::max(high, v);
      }
      const float s = std::max(std::max(std::fabs(high), std::fabs(low)) / 127.f,
                               std::numeric_limits<float>::min());
      scale[r] = s;
      for (int64_t i = 0; i < k; ++i) {
        const float code = std::nearbyint(element(w, r * k + i) / s);
        q[r * k + i] = static_cast<int8_t>(std::clamp(code, -128.f, 127.f));
      }
    }
  });
}

template <typename T>
void quantize_groups_int4(const T* w, int64_t rows, int64_t k, int64_t group, uint8_t* q,
                          uint16_t* scale, uint16_t* min) {
  const int64_t groups = k / group;
  at::parallel_for(0, rows * groups, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t first = t * group;  // rows and groups are contiguous: t = r * groups + g
      float low = element(w, first), high = low;
      for (int64_t i = 1; i < group; ++i) {
        const float v = element(w, first + i);
        low = std::min(low, v);
        high = std::max(high, v);
      }
      const c10::BFloat16 s((high - low) / 15.f), lo(low);
      scale[t] = s.x;
      min[t] = lo.x;
      const float step = std::max(static_cast<float>(s), std::numeric_limits<float>::min());
      const float base = static_cast<float>(lo);
      for (int64_t i = 0; i < group; ++i) {
        const float code = std::nearbyint((element(w, first + i) - base) / step);
        q[first + i] = static_cast<uint8_t>(std::clamp(code, 0.f, 15.f));
      }
    }
  });
}

void check_weight(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.device().is_cpu() &&
                  (w.scalar_type() == at::kBFloat16 || w.scalar_type() == at::kFloat),
              "the weight must be a contiguous (out, in) bfloat16 or float32 CPU tensor");
}

std::vector<at::Tensor> quantize_int8(const at::Tensor& w) {
  check_weight(w);
  const int64_t rows = w.size(0), k = w.size(1);
  TORCH_CHECK(k > 0, "the weight has no inputs");
  auto q = at::empty({rows, k}, w.options().dtype(at::kChar));
  auto scale = at::empty({rows}, w.options().dtype(at::kFloat));
  if (w.scalar_type() == at::kFloat)
    quantize_rows_int8(w.data_ptr<float>(), rows, k, q.data_ptr<int8_t>(), scale.data_ptr<float>());
  else
    quantize_rows_int8(reinterpret_cast<const uint16_t*>(w.data_ptr()), rows, k,
                       q.data_ptr<int8_t>(), scale.data_ptr<float>());
  return {q, scale};
}

std::vector<at::Tensor> quantize_int4(const at::Tensor& w, int64_t group) {
  check_weight(w);
  const int64_t rows = w.size(0), k = w.size(1);
  TORCH_CHECK(group > 0 && k % group == 0, "in (", k, ") must be a multiple of the group");
  auto q = at::empty({rows, k}, w.options().dtype(at::kByte));
  auto scale = at::empty({rows, k / group}, w.options().dtype(at::kBFloat16));
  auto min = at::empty({rows, k / group}, w.options().dtype(at::kBFloat16));
  auto* s = reinterpret_cast<uint16_t*>(scale.data_ptr());
  auto* lo = reinterpret_cast<uint16_t*>(min.data_ptr());
  if (w.scalar_type() == at::kFloat)
    quantize_groups_int4(w.data_ptr<float>(), rows, k, group, q.data_ptr<uint8_t>(), s, lo);
  else
    quantize_groups_int4(reinterpret_cast<const uint16_t*>(w.data_ptr()), rows, k, group,
                         q.data_ptr<uint8_t>(), s, lo);
  return {q, scale, min};
}

bool takes_float32() { return kTakesFloat32; }

bool supported() {
#if defined(SGLANG_GEMM_TILE) || defined(SGLANG_QUANT_AVX2)
  return true;
#else
  return false;
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("isa", [] { return SGLANG_COMPILED_ISA; }, "The instruction set of this build");
  m.def("supported", &supported, "Whether this build has vector kernels (AVX512-BF16 or AVX2)");
  m.def("takes_float32", &takes_float32,
        "Whether x (and so y) may be float32 (builds without the AVX512-BF16 tile)");
  m.def("linear_int8", &linear_int8,
        "x W^T (+ b), W int8 per output channel in the GEMM's panels; n output columns",
        py::arg("x"), py::arg("q"), py::arg("scale"), py::arg("bias"), py::arg("n"));
  m.def("quantize_int8", &quantize_int8,
        "W (out, in) -> codes int8 (out, in), scale float32 (out): per output channel",
        py::arg("w"));
  m.def("quantize_int4", &quantize_int4,
        "W (out, in) -> codes uint8 0..15 (out, in), scale and min bfloat16 (out, in / group)",
        py::arg("w"), py::arg("group"));
  m.def("linear_int4", &linear_int4,
        "x W^T (+ b), W int4 per group in the GEMM's panels; n output columns", py::arg("x"),
        py::arg("q"), py::arg("scale"), py::arg("min"), py::arg("group"), py::arg("bias"),
        py::arg("n"));
}
