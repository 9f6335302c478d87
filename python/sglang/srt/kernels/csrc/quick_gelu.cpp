// QuickGELU, x * sigmoid(1.702 x), of a bfloat16 tensor in one pass (CLIP-style and Qwen2-VL
// vision MLPs). HF's QuickGELUActivation takes three tensor passes, each rounding to bfloat16;
// this rounds where they round (1.702 x, the sigmoid, the product), so results differ from HF's
// only where the exponentials differ in their last float bits and that moves a bfloat16
// rounding (one unit in the last place, rarely).

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>  // bindings only (torch/extension.h builds twice as long)

#include <cmath>
#include <cstdint>

#include "vector_math.h"

namespace {

constexpr float kScale = 1.702f;

using vec::round_bf16;

inline float quick_gelu_one(float x) {
  const float t = round_bf16(kScale * x);
  const float s = round_bf16(1.f / (1.f + std::exp(-t)));
  return x * s;
}

void quick_gelu_rows(const c10::BFloat16* x, c10::BFloat16* y, int64_t n) {
  int64_t i = 0;
#ifdef SGLANG_AVX512
  const __m512 scale = _mm512_set1_ps(kScale), one = _mm512_set1_ps(1.f);
  for (; i + 16 <= n; i += 16) {
    const auto* bits = reinterpret_cast<const __m256i*>(x + i);
    const __m512 v = vec::widen16(_mm256_loadu_si256(bits));
    const __m512 t = vec::round_bf16(_mm512_mul_ps(scale, v));
    const __m512 e = vec::exp512(_mm512_sub_ps(_mm512_setzero_ps(), t));
    const __m512 s = vec::round_bf16(_mm512_div_ps(one, _mm512_add_ps(one, e)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), vec::narrow16(_mm512_mul_ps(v, s)));
  }
#endif
  for (; i < n; ++i) y[i] = c10::BFloat16(quick_gelu_one(static_cast<float>(x[i])));
}

at::Tensor quick_gelu(const at::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, "quick_gelu takes bfloat16");
  const auto in = x.contiguous();
  auto out = at::empty_like(in);
  const auto* src = in.data_ptr<c10::BFloat16>();
  auto* dst = out.data_ptr<c10::BFloat16>();
  at::parallel_for(0, in.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
    quick_gelu_rows(src + begin, dst + begin, end - begin);
  });
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("isa", [] { return SGLANG_COMPILED_ISA; }, "The instruction set of this build");
  m.def("quick_gelu", &quick_gelu, "x * sigmoid(1.702 x) of bfloat16 x, rounded as HF rounds it");
}
