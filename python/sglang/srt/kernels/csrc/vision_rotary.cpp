// Rotary position embedding of the Qwen-VL vision towers, q and k in one pass each.
//
// HF's apply_rotary_pos_emb_vision widens q and k to float32, multiplies by cos, adds
// rotate_half(x) * sin and rounds back: nine tensor passes over 4-byte elements per layer. This
// computes the same float32 operations in the same order for each element, each rounded as
// torch rounds it (no fused multiply-add: the file is compiled with contraction off), so the
// result is bit for bit HF's, and writes it once in the input's dtype (16 dims of each half at
// a time with AVX-512, one at a time elsewhere).
//
//   out[d]        = x[d] * cos[d]               - x[d + half] * sin[d]
//   out[d + half] = x[d + half] * cos[d + half] + x[d] * sin[d + half]
//
// x: (tokens, heads, dim) with the last dim contiguous (the q, k views of the fused qkv
// projection); cos, sin: (tokens, dim) float32. Returns contiguous (tokens, heads, dim) tensors.

#pragma GCC optimize("fp-contract=off")

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>  // bindings only (torch/extension.h builds twice as long)

#include <tuple>

#include "vector_math.h"

namespace {

#ifdef SGLANG_AVX512
// Lanes [0, n) of 16 (n <= 16).
inline __mmask16 first_lanes(int64_t n) {
  return static_cast<__mmask16>(n >= 16 ? 0xFFFF : (1u << n) - 1);
}

// 16 floats rounded to bfloat16 as torch rounds, stored to lanes `mask` of dst.
inline void store16_rounded(c10::BFloat16* dst, __m512 x, __mmask16 mask) {
  _mm256_mask_storeu_epi16(dst, mask, vec::narrow16(x));
}
inline void store16_rounded(float* dst, __m512 x, __mmask16 mask) {
  _mm512_mask_storeu_ps(dst, mask, x);
}

inline __m512 load16(const c10::BFloat16* src, __mmask16 mask) {
  return vec::widen16(_mm256_maskz_loadu_epi16(mask, src));
}
inline __m512 load16(const float* src, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, src); }

// One head's row: the two formulas above, 16 dims of each half at a time.
template <typename T>
void rotate_row(const T* in, const float* c, const float* s, int64_t half, T* o) {
  for (int64_t d = 0; d < half; d += 16) {
    const __mmask16 m = first_lanes(half - d);
    const __m512 x1 = load16(in + d, m), x2 = load16(in + half + d, m);
    const __m512 c1 = _mm512_maskz_loadu_ps(m, c + d), s1 = _mm512_maskz_loadu_ps(m, s + d);
    const __m512 c2 = _mm512_maskz_loadu_ps(m, c + half + d);
    const __m512 s2 = _mm512_maskz_loadu_ps(m, s + half + d);
    store16_rounded(o + d, _mm512_sub_ps(_mm512_mul_ps(x1, c1), _mm512_mul_ps(x2, s1)), m);
    store16_rounded(o + half + d, _mm512_add_ps(_mm512_mul_ps(x2, c2), _mm512_mul_ps(x1, s2)), m);
  }
}
#else
template <typename T>
void rotate_row(const T* in, const float* c, const float* s, int64_t half, T* o) {
  for (int64_t d = 0; d < half; ++d) {
    const float x1 = static_cast<float>(in[d]), x2 = static_cast<float>(in[d + half]);
    o[d] = static_cast<T>(x1 * c[d] - x2 * s[d]);
    o[d + half] = static_cast<T>(x2 * c[d + half] + x1 * s[d + half]);
  }
}
#endif

template <typename T>
void rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out) {
  const int64_t tokens = x.size(0), heads = x.size(1), dim = x.size(2), half = dim / 2;
  const int64_t token_stride = x.stride(0), head_stride = x.stride(1);
  const T* src = x.data_ptr<T>();
  T* dst = out.data_ptr<T>();
  const float* cos_p = cos.data_ptr<float>();
  const float* sin_p = sin.data_ptr<float>();
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n)
      for (int64_t h = 0; h < heads; ++h)
        rotate_row(src + n * token_stride + h * head_stride, cos_p + n * dim, sin_p + n * dim,
                   half, dst + (n * heads + h) * dim);
  });
}

at::Tensor rotated(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1, "x: (tokens, heads, dim), last dim contiguous");
  TORCH_CHECK(x.size(2) % 2 == 0, "the head dim must be even");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat,
              "cos and sin must be float32");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous(), "cos and sin must be contiguous");
  TORCH_CHECK(cos.dim() == 2 && cos.size(0) == x.size(0) && cos.size(1) == x.size(2) &&
                  sin.sizes() == cos.sizes(),
              "cos and sin: (tokens, dim)");
  auto out = at::empty({x.size(0), x.size(1), x.size(2)}, x.options());
  if (x.scalar_type() == at::kBFloat16) {
    rotate<c10::BFloat16>(x, cos, sin, out);
  } else {
    TORCH_CHECK(x.scalar_type() == at::kFloat, "x must be bfloat16 or float32");
    rotate<float>(x, cos, sin, out);
  }
  return out;
}

std::tuple<at::Tensor, at::Tensor> rotary_pair(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& cos, const at::Tensor& sin) {
  return {rotated(q, cos, sin), rotated(k, cos, sin)};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("isa", [] { return SGLANG_COMPILED_ISA; }, "The instruction set of this build");
  m.def("rotary_pair", &rotary_pair,
        "q and k rotated as HF's apply_rotary_pos_emb_vision rotates them, bit for bit");
}
