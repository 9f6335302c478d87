// The int8 dynamic kernels' rows: each row of x quantized to int8 as it arrives, the
// output stores, and the walk over panels and blocks of rows.
// Part of linear_int8dq.cpp (included once, after its ISA macros).
#pragma once

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

}  // namespace
