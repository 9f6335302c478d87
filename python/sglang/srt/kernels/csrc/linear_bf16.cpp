// y = x W^T (+ b) for a few rows of bfloat16 x (decode steps: one row per request) and bfloat16
// W of shape (out, in): a matrix-vector product whose cost is reading W once, so it is written
// to stream W at memory bandwidth. A weight row is dotted with up to kGroup rows of x at once
// (their rows stay in L1). With more rows, weight rows are taken kOutBlock at a time (96 KB at
// 1536 inputs: they stay in L2) and every group of kGroup rows of x passes over them, so W is
// still read from memory once. Dotting a weight row with 8 rows at once (x no longer fits in L1
// beside the weight stream) took twice as long as with 4 (2B-shaped decode step, AMD EPYC, 2
// threads, the step's products: 4 rows 28.2 ms, 8 rows 55.5 -> 38.4 ms with the blocks, torch's
// 54.6; 16 rows 102.7 -> 64.2 ms, torch's 67.5). Products accumulate in float32.
//
// With AVX512-BF16 (compiled for the machine that loads it: -march=native) the dot products use
// vdpbf16ps, 32 bfloat16 pairs per instruction; elsewhere a portable loop that the compiler
// vectorizes for the ISA present. linear_f32 runs float32 weights through the same loop: on CPUs
// without native bfloat16 (float32 serving), torch's float32 product of 2-16 rows read a
// 7B-shaped layer's weights at 0.12-0.27 of the copy bandwidth (AMD Zen 3, AVX2), one row 0.71.
//
// linear_mixed takes float32 x and a bfloat16 W (weights stored in bfloat16 on CPUs that compute
// in float32): each weight is widened exactly (its bits shifted into a float32's high half) in
// registers and multiplied in float32 FMAs, so the result is the float32 product with the
// widened weight, read at half the bytes. widen_bf16 writes a widened copy of W (prompt chunks
// multiply that with torch's float32 GEMM, a stretch of rows at a time).

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>  // bindings only (torch/extension.h builds twice as long)

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define SGLANG_AVX512_BF16 1
#define SGLANG_COMPILED_ISA "avx512_bf16"
#elif defined(__AVX2__) && defined(__FMA__)
#define SGLANG_COMPILED_ISA "avx2"
#else
#define SGLANG_COMPILED_ISA "portable"
#endif
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SGLANG_MIXED_AVX2 1
#endif

namespace {

constexpr int kGroup = 4;          // rows of x dotted with a weight row at once
constexpr int64_t kOutBlock = 32;  // weight rows every group passes over before the next ones

#ifdef SGLANG_AVX512_BF16
template <int M>
void dot_rows(const uint16_t* w, const uint16_t* x, int64_t x_stride, int64_t k, float* out) {
  __m512 acc[M];
  for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + i);
    for (int m = 0; m < M; ++m) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + m * x_stride + i);
      acc[m] = _mm512_dpbf16_ps(acc[m], wv, xv);
    }
  }
  if (i < k) {
    const __mmask32 mask = (__mmask32)((1ull << (k - i)) - 1);
    const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + i);
    for (int m = 0; m < M; ++m) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + m * x_stride + i);
      acc[m] = _mm512_dpbf16_ps(acc[m], wv, xv);
    }
  }
  for (int m = 0; m < M; ++m) out[m] = _mm512_reduce_add_ps(acc[m]);
}
#endif

inline float to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
inline float to_float(float v) { return v; }

// The portable loop: 16 float32 lanes per row, summed at the end.
template <typename T, int M>
void dot_rows_plain(const T* w, const T* x, int64_t x_stride, int64_t k, float* out) {
  constexpr int kLanes = 16;
  float acc[M][kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= k; i += kLanes)
    for (int m = 0; m < M; ++m)
      for (int l = 0; l < kLanes; ++l)
        acc[m][l] += to_float(w[i + l]) * to_float(x[m * x_stride + i + l]);
  for (int m = 0; m < M; ++m) {
    float sum = 0.f;
    for (int l = 0; l < kLanes; ++l) sum += acc[m][l];
    for (int64_t j = i; j < k; ++j) sum += to_float(w[j]) * to_float(x[m * x_stride + j]);
    out[m] = sum;
  }
}

#ifndef SGLANG_AVX512_BF16
template <int M>
void dot_rows(const uint16_t* w, const uint16_t* x, int64_t x_stride, int64_t k, float* out) {
  dot_rows_plain<uint16_t, M>(w, x, x_stride, k, out);
}
#endif

// bfloat16 weights (their bits) times float32 rows, in float32.
#ifdef SGLANG_MIXED_AVX2
inline __m256 widen8(const uint16_t* w) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

template <int M>
void dot_rows_mixed(const uint16_t* w, const float* x, int64_t x_stride, int64_t k, float* out) {
  __m256 acc[M][2];
  for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    const __m256 w0 = widen8(w + i), w1 = widen8(w + i + 8);
    for (int m = 0; m < M; ++m) {
      acc[m][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + m * x_stride + i), acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + m * x_stride + i + 8), acc[m][1]);
    }
  }
  for (int m = 0; m < M; ++m) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, _mm256_add_ps(acc[m][0], acc[m][1]));
    float sum = 0.f;
    for (int l = 0; l < 8; ++l) sum += lanes[l];
    for (int64_t j = i; j < k; ++j) sum += to_float(w[j]) * x[m * x_stride + j];
    out[m] = sum;
  }
}
#else
template <int M>
void dot_rows_mixed(const uint16_t* w, const float* x, int64_t x_stride, int64_t k, float* out) {
  float acc[M] = {};
  for (int64_t i = 0; i < k; ++i)
    for (int m = 0; m < M; ++m) acc[m] += to_float(w[i]) * x[m * x_stride + i];
  for (int m = 0; m < M; ++m) out[m] = acc[m];
}
#endif

template <typename T, typename W = T>
using DotFn = void (*)(const W*, const T*, int64_t, int64_t, float*);

template <typename T, typename W = T>
DotFn<T, W> dot_for(int rows) {
  if constexpr (!std::is_same_v<T, W>) {
    static const DotFn<T, W> table[kGroup] = {dot_rows_mixed<1>, dot_rows_mixed<2>,
                                              dot_rows_mixed<3>, dot_rows_mixed<4>};
    return table[rows - 1];
  } else if constexpr (std::is_same_v<T, float>) {
    static const DotFn<T> table[kGroup] = {dot_rows_plain<float, 1>, dot_rows_plain<float, 2>,
                                           dot_rows_plain<float, 3>, dot_rows_plain<float, 4>};
    return table[rows - 1];
  } else {
    static const DotFn<T> table[kGroup] = {dot_rows<1>, dot_rows<2>, dot_rows<3>, dot_rows<4>};
    return table[rows - 1];
  }
}

inline void store_as(c10::BFloat16* y, float v) { *y = c10::BFloat16(v); }
inline void store_as(float* y, float v) { *y = v; }

// x (rows, in) times weight (out, in): Storage is x's dtype, c10::BFloat16 (T uint16_t, its
// bits) or float; WStorage the weight's (W its bits), the same as x's or bfloat16 under float32.
template <typename Storage, typename T, typename WStorage = Storage, typename W = T>
at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& weight,
                       const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2, "x (rows, in), weight (out, in)");
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), "x and weight must be contiguous");
  TORCH_CHECK(x.size(1) == weight.size(1), "in_features differ");
  const int64_t rows = x.size(0), k = x.size(1), n = weight.size(0);
  auto out = at::empty({rows, n}, x.options());
  const float* bias_ptr = nullptr;
  at::Tensor bias_f;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == n, "bias has the wrong size");
    bias_f = bias->to(at::kFloat).contiguous();
    bias_ptr = bias_f.data_ptr<float>();
  }
  const auto* w = reinterpret_cast<const W*>(weight.data_ptr<WStorage>());
  const auto* xs = reinterpret_cast<const T*>(x.data_ptr<Storage>());
  auto* y = out.data_ptr<Storage>();
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    float partial[kGroup];
    const int64_t out_block = rows <= kGroup ? end - begin : kOutBlock;
    for (int64_t jb = begin; jb < end; jb += out_block) {
      const int64_t je = std::min(end, jb + out_block);
      for (int64_t m0 = 0; m0 < rows; m0 += kGroup) {
        const int group = static_cast<int>(std::min<int64_t>(kGroup, rows - m0));
        const DotFn<T, W> dot = dot_for<T, W>(group);
        for (int64_t j = jb; j < je; ++j) {
          dot(w + j * k, xs + m0 * k, k, k, partial);
          const float b = bias_ptr ? bias_ptr[j] : 0.f;
          for (int m = 0; m < group; ++m) store_as(y + (m0 + m) * n + j, partial[m] + b);
        }
      }
    }
  });
  return out;
}

at::Tensor linear_bf16(const at::Tensor& x, const at::Tensor& weight,
                       const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16,
              "linear_bf16 takes bfloat16 x and weight");
  return linear_rows<c10::BFloat16, uint16_t>(x, weight, bias);
}

at::Tensor linear_f32(const at::Tensor& x, const at::Tensor& weight,
                      const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat,
              "linear_f32 takes float32 x and weight");
  return linear_rows<float, float>(x, weight, bias);
}

at::Tensor linear_mixed(const at::Tensor& x, const at::Tensor& weight,
                        const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kBFloat16,
              "linear_mixed takes float32 x and a bfloat16 weight");
  return linear_rows<float, float, c10::BFloat16, uint16_t>(x, weight, bias);
}

// A float32 copy of a contiguous bfloat16 tensor (exact), written by every thread.
at::Tensor widen_bf16(const at::Tensor& src) {
  TORCH_CHECK(src.scalar_type() == at::kBFloat16 && src.is_contiguous(),
              "widen_bf16 takes a contiguous bfloat16 tensor");
  auto out = at::empty(src.sizes(), src.options().dtype(at::kFloat));
  const auto* bits = reinterpret_cast<const uint16_t*>(src.data_ptr<c10::BFloat16>());
  auto* dst = reinterpret_cast<uint32_t*>(out.data_ptr<float>());
  at::parallel_for(0, src.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dst[i] = static_cast<uint32_t>(bits[i]) << 16;
  });
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("isa", [] { return SGLANG_COMPILED_ISA; }, "The instruction set of this build");
  m.def("linear_bf16", &linear_bf16, "x W^T (+ b) for a few bfloat16 rows, at memory bandwidth",
        py::arg("x"), py::arg("weight"), py::arg("bias") = py::none());
  m.def("linear_f32", &linear_f32, "x W^T (+ b) for a few float32 rows, at memory bandwidth",
        py::arg("x"), py::arg("weight"), py::arg("bias") = py::none());
  m.def("linear_mixed", &linear_mixed, "float32 x times a bfloat16 W^T (+ b), in float32",
        py::arg("x"), py::arg("weight"), py::arg("bias") = py::none());
  m.def("widen_bf16", &widen_bf16, "A float32 copy of a bfloat16 tensor", py::arg("src"));
}
