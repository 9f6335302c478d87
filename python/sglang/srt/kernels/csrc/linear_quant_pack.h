// Weights to codes: `quantize_int8`, `quantize_int4`.
// Part of linear_quant.cpp (included once, after its helpers).
#pragma once

namespace {

// Round-to-nearest quantizers, rows in parallel: the same codes, scales and mins as
// quantized_linear's torch definitions (float32 division, round half to even, bfloat16 by
// round to nearest even), without torch's float32 copy of the weight and its passes over it.
template <typename T>
inline float element(const T* w, int64_t i) {
  if constexpr (std::is_same_v<T, float>) return w[i];
  else return bf16_to_float(w[i]);
}

template <typename T>
void quantize_rows_int8(const T* w, int64_t rows, int64_t k, int8_t* q, float* scale) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float low = element(w, r * k), high = low;
      for (int64_t i = 1; i < k; ++i) {
        const float v = element(w, r * k + i);
        low = std::min(low, v);
        high = std::max(high, v);
      }
      const float s = std::max(std::max(std::fabs(high), std::fabs(low)) / 127.f,
                               std::numeric_limits<float>::min());
      scale[r] = s;
      for (int64_t i = 0; i < k; ++i) {
        const float code = std::nearbyint(element(w, r * k + i) / s);
        q[r * k + i] = static_cast<int8_t>(std::clamp(code, -128.f, 127.f));
      }
    }
  });
}

template <typename T>
void quantize_groups_int4(const T* w, int64_t rows, int64_t k, int64_t group, uint8_t* q,
                          uint16_t* scale, uint16_t* min) {
  const int64_t groups = k / group;
  at::parallel_for(0, rows * groups, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t first = t * group;  // rows and groups are contiguous: t = r * groups + g
      float low = element(w, first), high = low;
      for (int64_t i = 1; i < group; ++i) {
        const float v = element(w, first + i);
        low = std::min(low, v);
        high = std::max(high, v);
      }
      const c10::BFloat16 s((high - low) / 15.f), lo(low);
      scale[t] = s.x;
      min[t] = lo.x;
      const float step = std::max(static_cast<float>(s), std::numeric_limits<float>::min());
      const float base = static_cast<float>(lo);
      for (int64_t i = 0; i < group; ++i) {
        const float code = std::nearbyint((element(w, first + i) - base) / step);
        q[first + i] = static_cast<uint8_t>(std::clamp(code, 0.f, 15.f));
      }
    }
  });
}

void check_weight(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.device().is_cpu() &&
                  (w.scalar_type() == at::kBFloat16 || w.scalar_type() == at::kFloat),
              "the weight must be a contiguous (out, in) bfloat16 or float32 CPU tensor");
}

std::vector<at::Tensor> quantize_int8(const at::Tensor& w) {
  check_weight(w);
  const int64_t rows = w.size(0), k = w.size(1);
  TORCH_CHECK(k > 0, "the weight has no inputs");
  auto q = at::empty({rows, k}, w.options().dtype(at::kChar));
  auto scale = at::empty({rows}, w.options().dtype(at::kFloat));
  if (w.scalar_type() == at::kFloat)
    quantize_rows_int8(w.data_ptr<float>(), rows, k, q.data_ptr<int8_t>(), scale.data_ptr<float>());
  else
    quantize_rows_int8(reinterpret_cast<const uint16_t*>(w.data_ptr()), rows, k,
                       q.data_ptr<int8_t>(), scale.data_ptr<float>());
  return {q, scale};
}

std::vector<at::Tensor> quantize_int4(const at::Tensor& w, int64_t group) {
  check_weight(w);
  const int64_t rows = w.size(0), k = w.size(1);
  TORCH_CHECK(group > 0 && k % group == 0, "in (", k, ") must be a multiple of the group");
  auto q = at::empty({rows, k}, w.options().dtype(at::kByte));
  auto scale = at::empty({rows, k / group}, w.options().dtype(at::kBFloat16));
  auto min = at::empty({rows, k / group}, w.options().dtype(at::kBFloat16));
  auto* s = reinterpret_cast<uint16_t*>(scale.data_ptr());
  auto* lo = reinterpret_cast<uint16_t*>(min.data_ptr());
  if (w.scalar_type() == at::kFloat)
    quantize_groups_int4(w.data_ptr<float>(), rows, k, group, q.data_ptr<uint8_t>(), s, lo);
  else
    quantize_groups_int4(reinterpret_cast<const uint16_t*>(w.data_ptr()), rows, k, group,
                         q.data_ptr<uint8_t>(), s, lo);
  return {q, scale, min};
}

}  // namespace
