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
#else
#define SGLANG_COMPILED_ISA "portable"
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

template <typename T>
using DotFn = void (*)(const T*, const T*, int64_t, int64_t, float*);

template <typename T>
DotFn<T> dot_for(int rows) {
  if constexpr (std::is_same_v<T, float>) {
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

// x (rows, in) times weight (out, in), both of the kernel's dtype: Storage is c10::BFloat16
// (T uint16_t, its bits) or float.
template <typename Storage, typename T>
at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& weight,
                       const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2, "x (rows, in), weight (out, in)");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "x and weight have different dtypes");
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
  const auto* w = reinterpret_cast<const T*>(weight.data_ptr<Storage>());
  const auto* xs = reinterpret_cast<const T*>(x.data_ptr<Storage>());
  auto* y = out.data_ptr<Storage>();
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    float partial[kGroup];
    const int64_t out_block = rows <= kGroup ? end - begin : kOutBlock;
    for (int64_t jb = begin; jb < end; jb += out_block) {
      const int64_t je = std::min(end, jb + out_block);
      for (int64_t m0 = 0; m0 < rows; m0 += kGroup) {
        const int group = static_cast<int>(std::min<int64_t>(kGroup, rows - m0));
        const DotFn<T> dot = dot_for<T>(group);
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
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, "linear_bf16 takes bfloat16 x and weight");
  return linear_rows<c10::BFloat16, uint16_t>(x, weight, bias);
}

at::Tensor linear_f32(const at::Tensor& x, const at::Tensor& weight,
                      const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "linear_f32 takes float32 x and weight");
  return linear_rows<float, float>(x, weight, bias);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("isa", [] { return SGLANG_COMPILED_ISA; }, "The instruction set of this build");
  m.def("linear_bf16", &linear_bf16, "x W^T (+ b) for a few bfloat16 rows, at memory bandwidth",
        py::arg("x"), py::arg("weight"), py::arg("bias") = py::none());
  m.def("linear_f32", &linear_f32, "x W^T (+ b) for a few float32 rows, at memory bandwidth",
        py::arg("x"), py::arg("weight"), py::arg("bias") = py::none());
}
