// int4 weights times int8 activations (8da4w-<group>): the octet layout's tiles and
// `linear_int4`.
// Part of linear_int8dq.cpp (included once, after its ISA macros).
#pragma once

namespace {

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

}  // namespace
