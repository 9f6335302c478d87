// Rotary position embedding of the Llama-style language models in bfloat16, q and k in one pass
// each: HF's apply_rotary_pos_emb (q * cos + rotate_half(q) * sin, cos and sin unsqueezed at
// the head dim) takes six tensor passes per tensor (two products, the halves' negation and
// concatenation, the sum), each rounded to bfloat16. This rounds each product and the sum as
// torch does (float32 arithmetic, no fused multiply-add: the file is compiled with contraction
// off), so the result is bit for bit HF's:
//
//   out[d]        = bf16(bf16(x[d] * cos[d])               + bf16(-x[d + half] * sin[d]))
//   out[d + half] = bf16(bf16(x[d + half] * cos[d + half]) + bf16(x[d] * sin[d + half]))
//
// x: (batch, heads, tokens, dim), any strides with the last dim contiguous (the transposed
// views of the projections); cos, sin: (batch, tokens, dim) contiguous. The result has x's
// layout.

#pragma GCC optimize("fp-contract=off")

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>  // bindings only (torch/extension.h builds twice as long)

#include <algorithm>
#include <tuple>

#include "vector_math.h"

namespace {

using BF16 = c10::BFloat16;

using vec::round_bf16;

void rotate_row(const BF16* in, const BF16* c, const BF16* s, int64_t half, BF16* o) {
  int64_t d = 0;
#ifdef SGLANG_AVX512
  auto load = [](const BF16* p) {
    return vec::widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  };
  auto store = [](BF16* p, __m512 v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), vec::narrow16(v));
  };
  const __m512 sign = _mm512_set1_ps(-0.f);
  for (; d + 16 <= half; d += 16) {
    const __m512 x1 = load(in + d), x2 = load(in + half + d);
    const __m512 a1 = vec::round_bf16(_mm512_mul_ps(x1, load(c + d)));
    const __m512 b1 = vec::round_bf16(_mm512_mul_ps(_mm512_xor_ps(x2, sign), load(s + d)));
    const __m512 a2 = vec::round_bf16(_mm512_mul_ps(x2, load(c + half + d)));
    const __m512 b2 = vec::round_bf16(_mm512_mul_ps(x1, load(s + half + d)));
    store(o + d, _mm512_add_ps(a1, b1));
    store(o + half + d, _mm512_add_ps(a2, b2));
  }
#endif
  for (; d < half; ++d) {
    const float x1 = static_cast<float>(in[d]), x2 = static_cast<float>(in[d + half]);
    const float c1 = static_cast<float>(c[d]), s1 = static_cast<float>(s[d]);
    const float c2 = static_cast<float>(c[d + half]), s2 = static_cast<float>(s[d + half]);
    o[d] = BF16(round_bf16(x1 * c1) + round_bf16(-x2 * s1));
    o[d + half] = BF16(round_bf16(x2 * c2) + round_bf16(x1 * s2));
  }
}

at::Tensor rotated(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 4 && x.stride(3) == 1, "x: (batch, heads, tokens, dim), dim contiguous");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && cos.scalar_type() == at::kBFloat16 &&
                  sin.scalar_type() == at::kBFloat16,
              "rotary takes bfloat16");
  TORCH_CHECK(x.size(3) % 2 == 0, "the head dim must be even");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.sizes() == sin.sizes(),
              "cos and sin: contiguous, one shape");
  TORCH_CHECK(cos.dim() == 3 && cos.size(0) == x.size(0) && cos.size(1) == x.size(2) &&
                  cos.size(2) == x.size(3),
              "cos and sin: (batch, tokens, dim)");
  auto out = at::empty_like(x);  // x's layout (a dense transposed view stays one)
  const int64_t batch = x.size(0), heads = x.size(1), tokens = x.size(2), dim = x.size(3);
  const int64_t half = dim / 2;
  const BF16* src = x.data_ptr<BF16>();
  BF16* dst = out.data_ptr<BF16>();
  const BF16* cos_p = cos.data_ptr<BF16>();
  const BF16* sin_p = sin.data_ptr<BF16>();
  const int64_t xs0 = x.stride(0), xs1 = x.stride(1), xs2 = x.stride(2);
  const int64_t os0 = out.stride(0), os1 = out.stride(1), os2 = out.stride(2);
  const int64_t grain = std::max<int64_t>(1, 256 / std::max<int64_t>(heads, 1));
  at::parallel_for(0, batch * tokens, grain, [&](int64_t begin, int64_t end) {
    for (int64_t bt = begin; bt < end; ++bt) {
      const int64_t b = bt / tokens, t = bt % tokens;
      const BF16* c = cos_p + bt * dim;
      const BF16* s = sin_p + bt * dim;
      for (int64_t h = 0; h < heads; ++h)
        rotate_row(src + b * xs0 + h * xs1 + t * xs2, c, s, half, dst + b * os0 + h * os1 + t * os2);
    }
  });
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
        "bfloat16 q and k rotated as HF's apply_rotary_pos_emb rotates them, bit for bit");
}
