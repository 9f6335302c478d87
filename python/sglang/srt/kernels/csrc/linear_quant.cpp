// Weight-only quantized linears: y = x W^T (+ b) for bfloat16 x and int8 or int4 W.
//
// int8 (per output channel, symmetric) is stored in the native GEMM's panel order and runs on
// its tile: see linear_int8 below. Decode rows and prompt chunks multiply the same exact codes,
// the scale applied once per output.
//
// int4 (groups of `group` inputs, asymmetric): q uint8 (out, in / 2), scale and min bfloat16
//   (out, in / group); W[j, k] = bfloat16(scale[j, g] * q[j, k] + min[j, g]), g = k / group
//   (one float32 fma, rounded to nearest even). Inputs come in blocks of 64: byte b of a block
//   holds input b in its low nibble and input 32 + b in its high nibble, so one 32-byte load
//   unpacks into two runs of 32 inputs. Decode rows: with AVX512-BF16 each nibble becomes its
//   group's bfloat16 weight through a 32-entry table (vpermw) and meets 32 bfloat16 inputs in one
//   vdpbf16ps; elsewhere a portable loop computes the same products in float32. Sums are float32
//   in a fixed order per output: results do not depend on the thread count. Rows of x are taken
//   up to kGroup at a time; with more rows, weight rows are taken kOutBlock at a time so that
//   every group of rows finds them in cache (as in linear_bf16.cpp). Prompt chunks: gemm_int4,
//   the same weights dequantized a panel at a time into the GEMM's tile.

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <vector>

#include "gemm_tile.h"
#include "run_tasks.h"
#include "vector_math.h"

namespace {

constexpr int kGroup = 4;
constexpr int64_t kOutBlock = 32;
constexpr int64_t kInt4Block = 64;

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// What one call needs to know, shared by every output row.
struct Int4Args {
  const uint8_t* q;
  const uint16_t* scale;
  const uint16_t* min;
  int64_t k;
  int64_t group;
};

#ifdef SGLANG_AVX512_BF16
// A group's 16 weights, bfloat16(scale * q + min) for q = 0..15, in lanes 0..15: the nibbles
// then look their weight up (vpermw) exactly as dequantize_int4 writes it.
inline __m512i group_table(uint16_t scale, uint16_t min) {
  const __m512 q = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 w = _mm512_fmadd_ps(q, _mm512_set1_ps(bf16_to_float(scale)),
                                   _mm512_set1_ps(bf16_to_float(min)));
  return _mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(w));
}

// One block of 64 inputs: adds the low and high halves' products to acc[.][first] and
// acc[.][first + 1], their weights looked up in the given tables.
template <int M>
inline void int4_block(const uint8_t* q, const uint16_t* x, int64_t x_stride, __m512i low_table,
                       __m512i high_table, __m512 (*acc)[4], int first) {
  const __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)q));
  const __m512bh low = (__m512bh)_mm512_permutexvar_epi16(
      _mm512_and_si512(bytes, _mm512_set1_epi16(0x0F)), low_table);
  const __m512bh high =
      (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(bytes, 4), high_table);
  for (int m = 0; m < M; ++m) {
    const uint16_t* xm = x + m * x_stride;
    acc[m][first] = _mm512_dpbf16_ps(acc[m][first], low, (__m512bh)_mm512_loadu_si512(xm));
    acc[m][first + 1] =
        _mm512_dpbf16_ps(acc[m][first + 1], high, (__m512bh)_mm512_loadu_si512(xm + 32));
  }
}

// Blocks are taken two at a time into four independent sums per row (the dot products'
// latency would otherwise serialise a single row).
template <int M>
void dot_int4(const Int4Args& a, int64_t j, const uint16_t* x, int64_t x_stride, float* out) {
  const int64_t groups = a.k / a.group;
  const uint8_t* q = a.q + j * (a.k / 2);
  const uint16_t* scale = a.scale + j * groups;
  const uint16_t* min = a.min + j * groups;
  auto table = [&](int64_t g) { return group_table(scale[g], min[g]); };
  __m512 acc[M][4];
  for (int m = 0; m < M; ++m)
    for (int t = 0; t < 4; ++t) acc[m][t] = _mm512_setzero_ps();
  if (a.group >= 2 * kInt4Block) {
    for (int64_t g = 0, i = 0; g < groups; ++g) {
      const __m512i t = table(g);
      for (const int64_t end = i + a.group; i < end; i += 2 * kInt4Block) {
        int4_block<M>(q + i / 2, x + i, x_stride, t, t, acc, 0);
        int4_block<M>(q + i / 2 + 32, x + i + kInt4Block, x_stride, t, t, acc, 2);
      }
    }
  } else {  // groups of 32 (a block's two halves) or 64 (one block)
    for (int64_t i = 0, b = 0; i < a.k; i += kInt4Block, ++b) {
      const __m512i low = a.group == 32 ? table(2 * b) : table(b);
      const __m512i high = a.group == 32 ? table(2 * b + 1) : low;
      int4_block<M>(q + i / 2, x + i, x_stride, low, high, acc, 2 * (b & 1));
    }
  }
  for (int m = 0; m < M; ++m) {
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]),
                                     _mm512_add_ps(acc[m][2], acc[m][3]));
    out[m] = _mm512_reduce_add_ps(sum);
  }
}
#else
template <int M>
void dot_int4(const Int4Args& a, int64_t j, const uint16_t* x, int64_t x_stride, float* out) {
  const int64_t groups = a.k / a.group;
  const uint8_t* q = a.q + j * (a.k / 2);
  for (int m = 0; m < M; ++m) {
    float sum = 0.f;
    for (int64_t i = 0; i < a.k; ++i) {
      const int64_t block = i / kInt4Block, at = i % kInt4Block;
      const uint8_t byte = q[block * 32 + at % 32];
      const int nibble = at < 32 ? byte & 0x0F : byte >> 4;
      const int64_t g = j * groups + i / a.group;
      const float w = c10::BFloat16(std::fma(static_cast<float>(nibble),
                                             bf16_to_float(a.scale[g]), bf16_to_float(a.min[g])));
      sum += w * bf16_to_float(x[m * x_stride + i]);
    }
    out[m] = sum;
  }
}
#endif

template <typename DotGroup>
at::Tensor run_rows(const at::Tensor& x, int64_t n, const c10::optional<at::Tensor>& bias,
                    DotGroup dot_group, const float* out_scale) {
  const int64_t rows = x.size(0);
  auto out = at::empty({rows, n}, x.options());
  at::Tensor bias_f;
  const float* bias_ptr = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == n, "bias has the wrong size");
    bias_f = bias->to(at::kFloat).contiguous();
    bias_ptr = bias_f.data_ptr<float>();
  }
  auto* y = out.data_ptr<c10::BFloat16>();
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    float partial[kGroup];
    const int64_t out_block = rows <= kGroup ? end - begin : kOutBlock;
    for (int64_t jb = begin; jb < end; jb += out_block) {
      const int64_t je = std::min(end, jb + out_block);
      for (int64_t m0 = 0; m0 < rows; m0 += kGroup) {
        const int group = static_cast<int>(std::min<int64_t>(kGroup, rows - m0));
        for (int64_t j = jb; j < je; ++j) {
          dot_group(group, j, m0, partial);
          const float s = out_scale ? out_scale[j] : 1.f;
          const float b = bias_ptr ? bias_ptr[j] : 0.f;
          for (int m = 0; m < group; ++m)
            y[(m0 + m) * n + j] = c10::BFloat16(partial[m] * s + b);
        }
      }
    }
  });
  return out;
}

void check_x(const at::Tensor& x, int64_t k) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(),
              "x must be contiguous bfloat16 (rows, in)");
  TORCH_CHECK(x.size(1) == k, "x has ", x.size(1), " inputs, the weight ", k);
}

// int8, in the native GEMM's panel order: q int8 (panels, pairs, 64, 2), pairs = in / 2
// rounded up: panel j holds output columns [64 j, 64 j + 64), for each pair of inputs
// (2p, 2p + 1) the two codes of a column side by side (gemm_bf16.cpp's order); codes past the
// weight's out or in are 0. scale float32 (panels * 64), 0 past out. y[c] = bfloat16(scale[c] *
// sum_k q[c, k] x[k] + b[c]): the codes are exact in bfloat16, the sum is float32 over the pairs
// in turn, the scale applied once. Rows are taken 1-7 at a time by the GEMM's tile; up to
// kCodeRows rows convert the codes in registers as they stream, more rows convert each panel
// once into a buffer that stays in cache: the same products, so a row's outputs are the same
// bits whatever the batch, decode or prompt.
constexpr int64_t kCodeRows = 16;
constexpr int64_t kPairBytes = 2 * gemm_tile::kPanelCols;

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

// Rows [0, R) x one panel's columns; the panel is codes (Codes) or their bfloat16 (a buffer).
template <int R, bool Codes>
void int8_tile(const uint16_t* a, int64_t lda, const void* panel, int64_t pairs,
               const float* scale, const float* bias, uint16_t* out, int64_t ldo, int64_t cols) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_setzero_ps();
  if (pairs < 1) __builtin_unreachable();  // keeps the accumulators out of stack slots
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh w[4];
    if constexpr (Codes) {
      code_pair(static_cast<const int8_t*>(panel) + p * kPairBytes, w);
    } else {
      const uint16_t* b = static_cast<const uint16_t*>(panel) + p * kPairBytes;
      for (int v = 0; v < 4; ++v) w[v] = (__m512bh)_mm512_loadu_si512(b + 32 * v);
    }
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, a + r * lda + 2 * p, sizeof(pair));
      const __m512bh x = (__m512bh)_mm512_set1_epi32(pair);
      for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], x, w[v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) {
      const __m512 y = _mm512_fmadd_ps(acc[r][v], _mm512_loadu_ps(scale + 16 * v),
                                       _mm512_loadu_ps(bias + 16 * v));
      gemm_tile::store16(y, out + r * ldo + 16 * v, cols - 16 * v);
    }
}

template <bool Codes>
void int8_rows(const uint16_t* x, int64_t lda, int64_t rows, const void* panel, int64_t pairs,
               const float* scale, const float* bias, uint16_t* out, int64_t ldo, int64_t cols) {
  int64_t r = 0;
  for (; r + 7 <= rows; r += 7)
    int8_tile<7, Codes>(x + r * lda, lda, panel, pairs, scale, bias, out + r * ldo, ldo, cols);
  const uint16_t* a = x + r * lda;
  uint16_t* o = out + r * ldo;
  switch (rows - r) {
    case 6: int8_tile<6, Codes>(a, lda, panel, pairs, scale, bias, o, ldo, cols); break;
    case 5: int8_tile<5, Codes>(a, lda, panel, pairs, scale, bias, o, ldo, cols); break;
    case 4: int8_tile<4, Codes>(a, lda, panel, pairs, scale, bias, o, ldo, cols); break;
    case 3: int8_tile<3, Codes>(a, lda, panel, pairs, scale, bias, o, ldo, cols); break;
    case 2: int8_tile<2, Codes>(a, lda, panel, pairs, scale, bias, o, ldo, cols); break;
    case 1: int8_tile<1, Codes>(a, lda, panel, pairs, scale, bias, o, ldo, cols); break;
    default: break;
  }
}
#endif

at::Tensor linear_int8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                       const c10::optional<at::Tensor>& bias, int64_t n) {
  TORCH_CHECK(q.dim() == 4 && q.scalar_type() == at::kChar && q.is_contiguous() &&
                  q.size(2) == gemm_tile::kPanelCols && q.size(3) == 2,
              "q must be contiguous int8 (panels, pairs, 64, 2)");
  const int64_t panels = q.size(0), pairs = q.size(1), k = 2 * pairs;
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() &&
                  scale.numel() == panels * gemm_tile::kPanelCols,
              "scale must be float32 (panels * 64)");
  TORCH_CHECK(n > (panels - 1) * gemm_tile::kPanelCols && n <= panels * gemm_tile::kPanelCols,
              "n disagrees with the panels");
  check_x(x, k);
  const int64_t m = x.size(0);
  auto out = at::empty({m, n}, x.options());
  if (m == 0) return out;
  std::vector<float> biases(panels * gemm_tile::kPanelCols, 0.f);
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == n, "bias has the wrong size");
    const auto b = bias->to(at::kFloat).contiguous();
    std::copy(b.data_ptr<float>(), b.data_ptr<float>() + n, biases.begin());
  }
  const auto* a = reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>());
  const auto* codes = q.data_ptr<int8_t>();
  const float* scales = scale.data_ptr<float>();
  auto* y = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
#ifdef SGLANG_GEMM_TILE
  std::vector<std::vector<uint16_t>> scratch(m > kCodeRows ? at::get_num_threads() : 0);
  run_tasks(panels, [&](int64_t j, int64_t worker) {
    const int8_t* panel = codes + j * pairs * kPairBytes;
    const int64_t c0 = j * gemm_tile::kPanelCols;
    const float* s = scales + c0;
    const float* b = biases.data() + c0;
    if (m <= kCodeRows) {
      int8_rows<true>(a, k, m, panel, pairs, s, b, y + c0, n, n - c0);
      return;
    }
    std::vector<uint16_t>& buffer = scratch[worker];
    buffer.resize(pairs * kPairBytes);
    for (int64_t p = 0; p < pairs; ++p) {
      __m512bh w[4];
      code_pair(panel + p * kPairBytes, w);
      for (int v = 0; v < 4; ++v)
        _mm512_storeu_si512(buffer.data() + p * kPairBytes + 32 * v, (__m512i)w[v]);
    }
    int8_rows<false>(a, k, m, buffer.data(), pairs, s, b, y + c0, n, n - c0);
  });
#else
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j)
      for (int64_t c = 0; c < std::min(gemm_tile::kPanelCols, n - j * gemm_tile::kPanelCols);
           ++c) {
        const int64_t col = j * gemm_tile::kPanelCols + c;
        for (int64_t r = 0; r < m; ++r) {
          float sum = 0.f;
          for (int64_t p = 0; p < pairs; ++p)
            for (int t = 0; t < 2; ++t)
              sum += static_cast<float>(codes[(j * pairs + p) * kPairBytes + 2 * c + t]) *
                     bf16_to_float(a[r * k + 2 * p + t]);
          y[r * n + col] = c10::BFloat16(std::fma(sum, scales[col], biases[col])).x;
        }
      }
  });
#endif
  return out;
}

void check_int4(const at::Tensor& q, const at::Tensor& scale, const at::Tensor& min,
                int64_t group) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kByte && q.is_contiguous(),
              "q must be contiguous uint8 (out, in / 2)");
  const int64_t k = q.size(1) * 2;
  TORCH_CHECK(group % 32 == 0 && (group == 32 || group % kInt4Block == 0) && k % group == 0 &&
                  k % kInt4Block == 0,
              "int4: in (", k, ") must be a multiple of 64 and of the group (", group,
              "), the group 32 or a multiple of 64");
  for (const at::Tensor* t : {&scale, &min}) {
    TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->is_contiguous() && t->dim() == 2 &&
                    t->size(0) == q.size(0) && t->size(1) == k / group,
                "scale and min must be bfloat16 (out, in / group)");
  }
}

at::Tensor linear_int4(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                       const at::Tensor& min, int64_t group,
                       const c10::optional<at::Tensor>& bias) {
  check_int4(q, scale, min, group);
  const int64_t n = q.size(0), k = q.size(1) * 2;
  check_x(x, k);
  const auto* xs = reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>());
  const Int4Args args{q.data_ptr<uint8_t>(),
                      reinterpret_cast<const uint16_t*>(scale.data_ptr<c10::BFloat16>()),
                      reinterpret_cast<const uint16_t*>(min.data_ptr<c10::BFloat16>()), k, group};
  auto dot_group = [&](int g, int64_t j, int64_t m0, float* partial) {
    const uint16_t* xm = xs + m0 * k;
    switch (g) {
      case 1: dot_int4<1>(args, j, xm, k, partial); break;
      case 2: dot_int4<2>(args, j, xm, k, partial); break;
      case 3: dot_int4<3>(args, j, xm, k, partial); break;
      default: dot_int4<4>(args, j, xm, k, partial); break;
    }
  };
  return run_rows(x, n, bias, dot_group, nullptr);
}

// The bfloat16 weight the quantized one stands for (W as defined above; int8 rounded as torch
// rounds), for prompt-sized inputs, which run on a bfloat16 GEMM: row by row (dequantize_*) or
// straight into the native GEMM's panels (dequantize_*_packed).
void dequant_row_int4(const uint8_t* q, const uint16_t* scale, const uint16_t* min, int64_t k,
                      int64_t group, uint16_t* w) {
  for (int64_t i = 0; i < k; i += 16) {  // 16 inputs: one nibble of 16 bytes
    const int64_t at = i % kInt4Block;
    const uint8_t* bytes = q + (i / kInt4Block) * 32 + at % 32;
    const int shift = at < 32 ? 0 : 4;
    const float s = bf16_to_float(scale[i / group]), lo = bf16_to_float(min[i / group]);
#ifdef SGLANG_AVX512_BF16
    const __m512i nibbles = _mm512_and_si512(
        _mm512_srli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)bytes)), shift),
        _mm512_set1_epi32(0x0F));
    const __m512 v =
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(nibbles), _mm512_set1_ps(s), _mm512_set1_ps(lo));
    _mm256_storeu_si256((__m256i*)(w + i), (__m256i)_mm512_cvtneps_pbh(v));
#else
    for (int t = 0; t < 16; ++t)
      w[i + t] =
          c10::BFloat16(std::fma(static_cast<float>((bytes[t] >> shift) & 0x0F), s, lo)).x;
#endif
  }
}

template <typename RowFn>
at::Tensor dequantize_rows(int64_t n, int64_t k, const at::TensorOptions& options, RowFn row) {
  auto out = at::empty({n, k}, options.dtype(at::kBFloat16));
  auto* w = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) row(j, w + j * k);
  });
  return out;
}

// gemm_bf16.cpp's operand layout (its pack()): panels of kPanelCols output columns, each
// [k / 2][kPanelCols][2] (the two weights of a column for inputs 2p, 2p + 1 side by side),
// columns past n zero. A panel's rows are dequantized into a buffer that stays in cache and
// transposed from there, so the weight is read quantized and written once.
using gemm_tile::kPanelCols;

#ifdef SGLANG_GEMM_TILE
// 16 vectors of 16 32-bit lanes, transposed in registers: r[i] lane j -> r[j] lane i.
inline void transpose16(__m512i* r) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  // b[4 i + j], 128-bit lane l: lane 4 l + j of rows 4 i .. 4 i + 3
  for (int j = 0; j < 4; ++j) {
    const __m512i c0 = _mm512_shuffle_i32x4(b[j], b[4 + j], 0x88);
    const __m512i c1 = _mm512_shuffle_i32x4(b[j], b[4 + j], 0xDD);
    const __m512i d0 = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], 0x88);
    const __m512i d1 = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], 0xDD);
    r[j] = _mm512_shuffle_i32x4(c0, d0, 0x88);
    r[8 + j] = _mm512_shuffle_i32x4(c0, d0, 0xDD);
    r[4 + j] = _mm512_shuffle_i32x4(c1, d1, 0x88);
    r[12 + j] = _mm512_shuffle_i32x4(c1, d1, 0xDD);
  }
}

// Panel `panel` of the dequantized weight straight into `out` (pairs * kPanelCols 32-bit
// pairs): `chunk(j, t)` gives output row j's bfloat16 weights for inputs [32 t, 32 t + 32)
// (the same values the row functions write); 16 rows x 16 pairs at a time are transposed in
// registers.
template <typename ChunkFn>
void dequantize_panel_simd(int64_t panel, int64_t n, int64_t k, ChunkFn& chunk, uint32_t* out) {
  const int64_t cols = std::min(kPanelCols, n - panel * kPanelCols), pairs = k / 2;
  for (int64_t t = 0; 32 * t < k; ++t) {
    const int64_t first = 16 * t, count = std::min<int64_t>(16, pairs - first);
    for (int64_t c0 = 0; c0 < kPanelCols; c0 += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = c0 + i < cols ? chunk(panel * kPanelCols + c0 + i, t) : _mm512_setzero_si512();
      transpose16(r);
      for (int64_t p = 0; p < count; ++p)
        _mm512_storeu_si512(out + (first + p) * kPanelCols + c0, r[p]);
    }
  }
}

// chunk() of the int8 and int4 layouts (as dequant_row_int8 / dequant_row_int4 compute them).
struct Int4Chunks {
  const uint8_t* q;
  const uint16_t* scale;
  const uint16_t* min;
  int64_t k;
  int64_t group;
  __m512i operator()(int64_t j, int64_t t) const {
    const int64_t groups = k / group, at = (32 * t) % kInt4Block;
    const uint8_t* bytes = q + j * (k / 2) + (32 * t / kInt4Block) * 32;
    const int shift = at < 32 ? 0 : 4;
    __m256i halves[2];
    for (int h = 0; h < 2; ++h) {
      const int64_t g = j * groups + (32 * t + 16 * h) / group;
      const __m512i nibbles = _mm512_and_si512(
          _mm512_srli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(bytes + 16 * h))),
                            shift),
          _mm512_set1_epi32(0x0F));
      const __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(nibbles),
                                       _mm512_set1_ps(bf16_to_float(scale[g])),
                                       _mm512_set1_ps(bf16_to_float(min[g])));
      halves[h] = (__m256i)_mm512_cvtneps_pbh(v);
    }
    return _mm512_inserti64x4(_mm512_castsi256_si512(halves[0]), halves[1], 1);
  }
};
#endif

// Panel `panel` of the dequantized weight into `out` (pairs * kPanelCols 32-bit pairs);
// `rows` is scratch of kPanelCols * k.
template <typename RowFn>
void dequantize_panel(int64_t panel, int64_t n, int64_t k, RowFn& row, uint16_t* rows,
                      uint32_t* out) {
  const int64_t cols = std::min(kPanelCols, n - panel * kPanelCols), pairs = k / 2;
  for (int64_t c = 0; c < kPanelCols; ++c) {
    if (c < cols) row(panel * kPanelCols + c, rows + c * k);
    else std::fill_n(rows + c * k, k, uint16_t{0});
  }
  const auto* src = reinterpret_cast<const uint32_t*>(rows);
  for (int64_t p = 0; p < pairs; ++p)
    for (int64_t c = 0; c < kPanelCols; ++c) out[p * kPanelCols + c] = src[c * pairs + p];
}

template <typename RowFn>
at::Tensor dequantize_panels(int64_t n, int64_t k, const at::TensorOptions& options, RowFn row) {
  TORCH_CHECK(k % 2 == 0, "the packed layout needs an even input size");
  const int64_t panels = (n + kPanelCols - 1) / kPanelCols, pairs = k / 2;
  auto packed = at::empty({panels, pairs, kPanelCols, 2}, options.dtype(at::kBFloat16));
  auto* dst = reinterpret_cast<uint32_t*>(packed.data_ptr<c10::BFloat16>());
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    std::vector<uint16_t> rows(kPanelCols * k);
    for (int64_t panel = begin; panel < end; ++panel)
      dequantize_panel(panel, n, k, row, rows.data(), dst + panel * pairs * kPanelCols);
  });
  return packed;
}

#ifdef SGLANG_GEMM_TILE
// x times the dequantized weight on the native GEMM's tile, one panel at a time: each thread
// dequantizes a panel into its own buffer (it stays in L2) and multiplies every row of x by
// it, so the weight is read once, quantized, and never exists whole in bfloat16. The products
// are bit for bit the GEMM's over dequantize_*_packed's panels.
template <typename ChunkFn>
at::Tensor gemm_dequantized(const at::Tensor& x, int64_t n, int64_t k,
                            const c10::optional<at::Tensor>& bias, ChunkFn chunk) {
  TORCH_CHECK(k % 2 == 0, "the packed layout needs an even input size");
  const int64_t m = x.size(0), panels = (n + kPanelCols - 1) / kPanelCols, pairs = k / 2;
  auto out = at::empty({m, n}, x.options());
  if (m == 0) return out;
  std::vector<float> biases(panels * kPanelCols, 0.f);
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == n, "bias has the wrong size");
    const auto b = bias->to(at::kFloat).contiguous();
    std::copy(b.data_ptr<float>(), b.data_ptr<float>() + n, biases.begin());
  }
  const auto* a = reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>());
  auto* y = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  std::vector<std::vector<uint32_t>> scratch(at::get_num_threads());
  run_tasks(panels, [&](int64_t j, int64_t worker) {
    std::vector<uint32_t>& panel = scratch[worker];
    panel.resize(pairs * kPanelCols);
    dequantize_panel_simd(j, n, k, chunk, panel.data());
    gemm_tile::panel_rows(a, k, m, reinterpret_cast<const uint16_t*>(panel.data()), pairs,
                          biases.data() + j * kPanelCols, y + j * kPanelCols, n,
                          n - j * kPanelCols);
  });
  return out;
}
#endif

template <bool Packed>
at::Tensor dequantize_int4(const at::Tensor& q, const at::Tensor& scale, const at::Tensor& min,
                           int64_t group) {
  check_int4(q, scale, min, group);
  const int64_t n = q.size(0), k = q.size(1) * 2, groups = k / group;
  const auto* qs = q.data_ptr<uint8_t>();
  const auto* ss = reinterpret_cast<const uint16_t*>(scale.data_ptr<c10::BFloat16>());
  const auto* ms = reinterpret_cast<const uint16_t*>(min.data_ptr<c10::BFloat16>());
  auto row = [&](int64_t j, uint16_t* w) {
    dequant_row_int4(qs + j * (k / 2), ss + j * groups, ms + j * groups, k, group, w);
  };
  return Packed ? dequantize_panels(n, k, q.options(), row)
                : dequantize_rows(n, k, q.options(), row);
}

at::Tensor gemm_int4(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                     const at::Tensor& min, int64_t group, const c10::optional<at::Tensor>& bias) {
  check_int4(q, scale, min, group);
  const int64_t n = q.size(0), k = q.size(1) * 2;
  check_x(x, k);
#ifdef SGLANG_GEMM_TILE
  const Int4Chunks chunk{q.data_ptr<uint8_t>(),
                         reinterpret_cast<const uint16_t*>(scale.data_ptr<c10::BFloat16>()),
                         reinterpret_cast<const uint16_t*>(min.data_ptr<c10::BFloat16>()), k, group};
  return gemm_dequantized(x, n, k, bias, chunk);
#else
  TORCH_CHECK(false, "gemm_int4 needs AVX512-BF16");
#endif
}

bool gemm_supported() {
#ifdef SGLANG_GEMM_TILE
  return true;
#else
  return false;
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("isa", [] { return SGLANG_COMPILED_ISA; }, "The instruction set of this build");
  m.def("linear_int4", &linear_int4, "x W^T (+ b), W int4 in groups with scales and mins",
        py::arg("x"), py::arg("q"), py::arg("scale"), py::arg("min"), py::arg("group"),
        py::arg("bias") = py::none());
  m.def("linear_int8", &linear_int8,
        "x W^T (+ b), W int8 per output channel in the GEMM's panels; n output columns",
        py::arg("x"), py::arg("q"), py::arg("scale"), py::arg("bias"), py::arg("n"));
  m.def("gemm_supported", &gemm_supported, "Whether gemm_int4 is built (AVX512-BF16)");
  m.def("gemm_int4", &gemm_int4, "x W^T (+ b) on the native GEMM, W int4 dequantized a panel at a time",
        py::arg("x"), py::arg("q"), py::arg("scale"), py::arg("min"), py::arg("group"),
        py::arg("bias") = py::none());
  m.def("dequantize_int4", &dequantize_int4<false>, "the bfloat16 weight of an int4 one");
  m.def("dequantize_int4_packed", &dequantize_int4<true>,
        "the bfloat16 weight of an int4 one, in gemm_bf16's packed panels");
}
