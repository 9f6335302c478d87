// A linear's bias as the panel kernels read it, shared by gemm_bf16.cpp, linear_quant.cpp and
// linear_int8dq.cpp.

#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gemm_tile.h"

// The bias (n) as float32 over whole panels of gemm_tile::kPanelCols, zero past n and without
// one.
inline std::vector<float> padded_bias(const c10::optional<at::Tensor>& bias, int64_t panels,
                                      int64_t n) {
  std::vector<float> biases(panels * gemm_tile::kPanelCols, 0.f);
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == n, "the bias must have n elements");
    const auto b = bias->to(at::kFloat).contiguous();
    std::copy(b.data_ptr<float>(), b.data_ptr<float>() + n, biases.begin());
  }
  return biases;
}
