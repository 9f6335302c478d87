// int4 weights, per group, times bfloat16 (or float32) rows: `linear_int4`.
// Part of linear_quant.cpp (included once, after its helpers and int8 product).
#pragma once

namespace {

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

}  // namespace
