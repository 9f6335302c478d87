// int8 weights (int8dq): the VNNI and AVX2 tiles over the quad layout and `linear`.
// Part of linear_int8dq.cpp (included once, after its ISA macros).
#pragma once

namespace {

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

}  // namespace
