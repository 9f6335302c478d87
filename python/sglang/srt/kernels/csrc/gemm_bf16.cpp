// y = x W^T (+ b) for prompt-sized bfloat16 x (M rows of K) and a bfloat16 weight W (N, K)
// packed once, at load, into the operand layout of vdpbf16ps (AVX512-BF16):
//
//   panel j: output columns [64 j, 64 j + 64), as [K/2][64][2]: for each pair of input dims
//   (2p, 2p + 1), the two weights of column c side by side. Columns past N are zero.
//
// A micro-kernel (gemm_tile.h) keeps a tile of 7 rows x 64 columns in 28 float32 registers for
// the whole K: per input pair it loads the panel's 4 vectors once and broadcasts each row's pair
// (one 32-bit load), 28 vdpbf16ps per 11 loads. With the broadcast that is one register more
// than the 32 there are, so GCC spills one value per input pair (a store and a load among 28
// products); 6-row tiles, which fit, measured the same. The tile starts from the bias and is
// rounded to bfloat16 once at the end (vcvtneps2bf16), so every output is one float32 sum over K
// in a fixed order: it does not depend on M, the other rows or the thread count.
//
// Tasks are (panel, block of kBlockRows rows), panel by panel, taken by the threads from a
// shared counter: a worker's consecutive tasks mostly share the panel (in its L2). With one
// block (up to 98 rows: decode steps, short chunks) each thread takes one contiguous run of
// panels instead, a single sequential stream of the weight, and more than one tile of rows goes
// over each panel span by span (see `span`).
// Measured against oneDNN's product on packed weights (AMD EPYC, AVX512-BF16, no AMX): 0.95 of
// vdpbf16ps's peak on one thread where oneDNN reached 0.86-0.91; see packed_linear.py for the
// engine's figures. CPUs with AMX keep oneDNN (its tiles are several times faster).

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>  // bindings only (torch/extension.h builds twice as long)

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gemm_tile.h"
#include "panel_bias.h"
#include "run_tasks.h"

#ifdef SGLANG_GEMM_TILE
#define SGLANG_GEMM_BF16 1
#define SGLANG_COMPILED_ISA "avx512_bf16"
#else
#define SGLANG_COMPILED_ISA "portable"
#endif

namespace {

using gemm_tile::kPanelCols;
using gemm_tile::kTileRows;
constexpr int64_t kBlockRows = 14 * kTileRows;  // rows per task

#ifdef SGLANG_GEMM_BF16
// A decode batch of more than one tile: each tile streaming the whole panel reads it from memory
// once and again from the outer caches for every further tile (a 7B down projection's panel is
// 2.4 MB). So the panel goes by spans of kSpanPairs input pairs (64 KB), every tile over a span
// while it is in L2. A tile's accumulators pass through `total` (64 float32 per row) between
// spans unchanged, so every output is the same float32 sum in the same order: the same bits.
// On a 7B-shaped layer (Zen 4, memory-bound phase), 8 / 16 / 32 rows: 7 / 7 / 3% faster.
constexpr int64_t kSpanPairs = 256;

// Rows [0, R): total += their products with the panel's pairs [p0, p1).
template <int R>
void span(const uint16_t* a, int64_t lda, const uint16_t* panel, int64_t p0, int64_t p1,
          float* total) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_load_ps(total + r * kPanelCols + 16 * v);
  if (p1 <= p0) __builtin_unreachable();  // keeps the accumulators out of stack slots
  for (int64_t p = p0; p < p1; ++p) {
    __m512bh w[4];
    for (int v = 0; v < 4; ++v)
      w[v] = (__m512bh)_mm512_loadu_si512(panel + (p * kPanelCols + 16 * v) * 2);
    gemm_tile::multiply_pair<R>(acc, a, lda, p, w);
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) _mm512_store_ps(total + r * kPanelCols + 16 * v, acc[r][v]);
}
#endif

bool supported() {
#ifdef SGLANG_GEMM_BF16
  return true;
#else
  return false;
#endif
}

// (N, K) bfloat16 -> (ceil(N / 64), K / 2, 64, 2), the panels above.
at::Tensor pack(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16 &&
                  weight.is_contiguous(),
              "the weight must be a contiguous (out, in) bfloat16 matrix");
  const int64_t n = weight.size(0), k = weight.size(1);
  TORCH_CHECK(k % 2 == 0 && k > 0 && n > 0, "the weight's input size must be even");
  const int64_t panels = (n + kPanelCols - 1) / kPanelCols;
  auto packed = at::zeros({panels, k / 2, kPanelCols, 2}, weight.options());
  const auto* w = reinterpret_cast<const uint16_t*>(weight.data_ptr<c10::BFloat16>());
  auto* dst = reinterpret_cast<uint16_t*>(packed.data_ptr<c10::BFloat16>());
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j)
      for (int64_t c = 0; c < std::min(kPanelCols, n - j * kPanelCols); ++c) {
        const uint16_t* row = w + (j * kPanelCols + c) * k;
        uint16_t* col = dst + j * (k / 2) * kPanelCols * 2 + c * 2;
        for (int64_t p = 0; p < k / 2; ++p) {
          col[p * kPanelCols * 2] = row[2 * p];
          col[p * kPanelCols * 2 + 1] = row[2 * p + 1];
        }
      }
  });
  return packed;
}

// x (M, K) bfloat16 with contiguous rows, packed from pack(), bias (N) or None -> (M, N).
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed,
                  const c10::optional<at::Tensor>& bias, int64_t n) {
  TORCH_CHECK(supported(), "this kernel needs AVX512-BF16");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.stride(1) == 1,
              "x must be (M, K) bfloat16 with contiguous rows");
  TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == at::kBFloat16 &&
                  packed.is_contiguous() && packed.size(2) == kPanelCols && packed.size(3) == 2,
              "packed must come from pack()");
  const int64_t m = x.size(0), k = x.size(1), pairs = packed.size(1), panels = packed.size(0);
  TORCH_CHECK(k == 2 * pairs && n > 0 && n <= panels * kPanelCols && n > (panels - 1) * kPanelCols,
              "x, packed and n disagree on the sizes");
  auto out = at::empty({m, n}, x.options());
  if (m == 0) return out;
  const std::vector<float> biases = padded_bias(bias, panels, n);
#ifdef SGLANG_GEMM_BF16
  const auto* a = reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>());
  const auto* w = reinterpret_cast<const uint16_t*>(packed.data_ptr<c10::BFloat16>());
  auto* y = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  const int64_t lda = x.stride(0), blocks = (m + kBlockRows - 1) / kBlockRows;
  auto task = [&](int64_t t) {
    const int64_t j = t / blocks, r0 = (t % blocks) * kBlockRows;
    gemm_tile::panel_rows(a + r0 * lda, lda, std::min(kBlockRows, m - r0),
                          w + j * pairs * kPanelCols * 2, pairs, biases.data() + j * kPanelCols,
                          y + r0 * n + j * kPanelCols, n, n - j * kPanelCols);
  };
  auto blocked = [&](int64_t j) {
    alignas(64) float total[kBlockRows * kPanelCols];
    const float* bias = biases.data() + j * kPanelCols;
    for (int64_t r = 0; r < m; ++r) std::copy(bias, bias + kPanelCols, total + r * kPanelCols);
    const uint16_t* panel = w + j * pairs * kPanelCols * 2;
    for (int64_t p0 = 0; p0 < pairs; p0 += kSpanPairs) {
      const int64_t p1 = std::min(pairs, p0 + kSpanPairs);
      gemm_tile::row_tiles<kTileRows>(m, [&](auto tile_rows, int64_t r) {
        span<decltype(tile_rows)::value>(a + r * lda, lda, panel, p0, p1, total + r * kPanelCols);
      });
    }
    for (int64_t r = 0; r < m; ++r)
      for (int i = 0; i < 4; ++i)
        gemm_tile::store16(_mm512_load_ps(total + r * kPanelCols + 16 * i),
                           y + r * n + j * kPanelCols + 16 * i, n - j * kPanelCols - 16 * i);
  };
  if (blocks == 1) {  // decode-sized: each thread streams one contiguous run of panels
    at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) m > kTileRows ? blocked(t) : task(t);
    });
  } else {
    run_tasks(panels * blocks, [&](int64_t t, int64_t) { task(t); });
  }
#endif
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("isa", [] { return SGLANG_COMPILED_ISA; }, "The instruction set of this build");
  m.def("supported", &supported, "Whether this build has the AVX512-BF16 kernel");
  m.def("pack", &pack, "(N, K) bfloat16 weight -> the kernel's panels");
  m.def("linear", &linear, "x (M, K) times a packed weight, plus bias -> (M, N) bfloat16");
}
