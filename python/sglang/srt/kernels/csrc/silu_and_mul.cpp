// SiLU-gated product of the gated MLPs, silu(gate) * up, of bfloat16 tensors in one pass. HF's
// MLPs take two tensor passes (the SiLU, rounded to bfloat16, then the product, rounded
// again); this rounds where they round, so results differ from HF's only where the
// exponentials differ in their last float bits and that moves a rounding (one unit in the last
// place, rarely). silu(x) = x / (1 + e^-x), as torch computes it.

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>  // bindings only (torch/extension.h builds twice as long)

#include <cmath>
#include <cstdint>

#include "vector_math.h"

namespace {

using vec::round_bf16;

void silu_and_mul_rows(const c10::BFloat16* gate, const c10::BFloat16* up, c10::BFloat16* out,
                       int64_t n) {
  int64_t i = 0;
#ifdef SGLANG_AVX512
  const __m512 one = _mm512_set1_ps(1.f);
  for (; i + 16 <= n; i += 16) {
    const __m512 g = vec::widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gate + i)));
    const __m512 u = vec::widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(up + i)));
    const __m512 e = vec::exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 silu = vec::round_bf16(_mm512_div_ps(g, _mm512_add_ps(one, e)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), vec::narrow16(_mm512_mul_ps(silu, u)));
  }
#endif
  for (; i < n; ++i) {
    const float g = static_cast<float>(gate[i]);
    out[i] = c10::BFloat16(round_bf16(g / (1.f + std::exp(-g))) * static_cast<float>(up[i]));
  }
}

at::Tensor silu_and_mul(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.scalar_type() == at::kBFloat16 && up.scalar_type() == at::kBFloat16,
              "silu_and_mul takes bfloat16");
  TORCH_CHECK(gate.sizes() == up.sizes(), "gate and up must have one shape");
  const auto g = gate.contiguous(), u = up.contiguous();
  auto out = at::empty_like(g);
  const auto* g_p = g.data_ptr<c10::BFloat16>();
  const auto* u_p = u.data_ptr<c10::BFloat16>();
  auto* o_p = out.data_ptr<c10::BFloat16>();
  at::parallel_for(0, g.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
    silu_and_mul_rows(g_p + begin, u_p + begin, o_p + begin, end - begin);
  });
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("isa", [] { return SGLANG_COMPILED_ISA; }, "The instruction set of this build");
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up of bfloat16 tensors, rounded as HF rounds");
}
