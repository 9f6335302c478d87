// RMSNorm of bfloat16 rows as HF computes it, in one pass per row, in its two forms:
// - rms_norm (Llama's): y = x / sqrt(mean(x^2) + eps) in float32, rounded to bfloat16, times
//   the bfloat16 weight, rounded again;
// - rms_norm_offset (Gemma's): x / sqrt(mean(x^2) + eps) times (1 + weight), all in float32,
//   rounded once to bfloat16.
// HF takes six or seven tensor passes for this (the cast to float32, the square, the mean, the
// rsqrt, the products, the casts). The result differs from HF's only where the sum of squares,
// added in another order, moves a rounding: by one unit in the last place (Gemma's), or by one
// unit of x / rms that the weight's product can carry to two (Llama's); rarely either way.

#pragma GCC optimize("fp-contract=off")

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>  // bindings only (torch/extension.h builds twice as long)

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "vector_math.h"

namespace {

using vec::round_bf16;

template <bool kOffset>
void norm_row(const c10::BFloat16* x, const c10::BFloat16* w, int64_t n, float eps,
              c10::BFloat16* out) {
  int64_t i = 0;
  float sum = 0.f;
#ifdef SGLANG_AVX512
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
  auto load = [](const c10::BFloat16* p) {
    return vec::widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  };
  for (; i + 64 <= n; i += 64)
    for (int a = 0; a < 4; ++a) {
      const __m512 v = load(x + i + 16 * a);
      acc[a] = _mm512_fmadd_ps(v, v, acc[a]);
    }
  for (; i + 16 <= n; i += 16) {
    const __m512 v = load(x + i);
    acc[0] = _mm512_fmadd_ps(v, v, acc[0]);
  }
  sum = _mm512_reduce_add_ps(
      _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
#endif
  for (; i < n; ++i) {
    const float v = static_cast<float>(x[i]);
    sum += v * v;
  }
  const float inv = 1.f / std::sqrt(sum / static_cast<float>(n) + eps);
  i = 0;
#ifdef SGLANG_AVX512
  const __m512 vinv = _mm512_set1_ps(inv), one = _mm512_set1_ps(1.f);
  for (; i + 16 <= n; i += 16) {
    const __m512 y = _mm512_mul_ps(load(x + i), vinv);
    const __m512 z = kOffset ? _mm512_mul_ps(y, _mm512_add_ps(one, load(w + i)))
                             : _mm512_mul_ps(load(w + i), vec::round_bf16(y));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), vec::narrow16(z));
  }
#endif
  for (; i < n; ++i) {
    const float y = static_cast<float>(x[i]) * inv, wi = static_cast<float>(w[i]);
    out[i] = c10::BFloat16(kOffset ? y * (1.f + wi) : wi * round_bf16(y));
  }
}

template <bool kOffset>
at::Tensor normalized(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16,
              "rms_norm takes bfloat16");
  TORCH_CHECK(weight.dim() == 1 && x.dim() >= 1 && x.size(-1) == weight.size(0),
              "rms_norm: the weight must have one value per element of a row");
  const auto xc = x.contiguous(), wc = weight.contiguous();
  auto out = at::empty_like(xc);
  const int64_t n = xc.size(-1), rows = n ? xc.numel() / n : 0;
  const auto* x_p = xc.data_ptr<c10::BFloat16>();
  const auto* w_p = wc.data_ptr<c10::BFloat16>();
  auto* o_p = out.data_ptr<c10::BFloat16>();
  const float e = static_cast<float>(eps);
  const int64_t grain = std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(n, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) norm_row<kOffset>(x_p + r * n, w_p, n, e, o_p + r * n);
  });
  return out;
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return normalized<false>(x, weight, eps);
}

at::Tensor rms_norm_offset(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return normalized<true>(x, weight, eps);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("isa", [] { return SGLANG_COMPILED_ISA; }, "The instruction set of this build");
  m.def("rms_norm", &rms_norm, "HF's Llama RMSNorm of bfloat16 rows (bfloat16 weight)");
  m.def("rms_norm_offset", &rms_norm_offset,
        "HF's Gemma RMSNorm of bfloat16 rows: times (1 + weight) in float32, rounded once");
}
