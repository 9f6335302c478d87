// Weight-only quantized linears on a CPU: y = x W^T (+ b) for bfloat16 x and int8 or int4 W,
// both stored in the native GEMM's panel order (gemm_bf16.cpp, gemm_tile.h: panels of 64 output
// columns, for each pair of inputs the two weights of a column side by side) and run on its
// tile at every row count: the codes become exact bfloat16 in registers as they stream, tile by
// tile over spans of the panel that stay in L1, so a row's outputs are the same bits whatever
// the batch, decode step or prompt chunk. Scales (and int4's mins) are applied to float32 sums,
// never to the weights: no weight is ever rounded to bfloat16. Sums are float32 in a fixed order
// per output: results depend neither on the batch nor on the thread count. Without AVX512-BF16
// a portable loop computes the same sums.
// The int4 product is in linear_quant_int4.h, the weights' quantizers in linear_quant_pack.h.

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

}  // namespace

#include "linear_quant_int4.h"
#include "linear_quant_pack.h"

namespace {

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
