// Dynamic int8 linears on a CPU: y = x W^T (+ b) with x quantized per row as it arrives and
// W int8 per output channel (SGLang's --torchao-config int8dq) or int4 per group (8da4w-<group>,
// further below: linear_int4), multiplied in integers.
//
//   x:  each row r to int8 codes p[r, k] = round_half_even(x[r, k] / sx[r]), sx[r] = max |x[r]|
//       / 127 (float32 division, as torch computes it);
//   W:  W[c, k] = sw[c] q[c, k], q in -128..127 (quantized_linear.quantize_int8);
//   y[r, c] = fma(float(sum_k p[r, k] q[c, k]), sx[r] sw[c], b[c]), rounded to x's dtype
//   (bfloat16, or float32 for a model served with float32 activations).
//
// The integer sum is exact (int32: |p q| <= 127 * 128, so K up to 131,000 inputs cannot
// overflow), so the result depends neither on the order of the sum, the batch, the tile nor the
// thread count, and the portable loop gives the same bits as the vector path.
//
// Layout, the operand order of AVX512-VNNI's vpdpbusd: panels of 64 output columns, for each
// quad of inputs (4 i .. 4 i + 3) the four codes of a column side by side: (panels, quads, 64, 4)
// int8, zero past the weight's out or in. vpdpbusd multiplies unsigned by signed bytes: the
// activations travel as p + 128 (0..255), and 128 sum_k q[c, k] (`offset`, int32, made with the
// panels by quantized_linear.pack_int8_quads) is taken off each sum. A tile keeps 6 rows x 64
// columns in 24 int32 registers over a span of K (see panel_rows): per quad, 4 weight vectors
// loaded once and one 32-bit broadcast per row, 4 vpdpbusd per row (each 64 multiply-adds,
// twice vdpbf16ps's 32); 0.89 of vpdpbusd's peak on one Zen 4 core (948 of 1,070 GOPS,
// cache-resident).
// Tasks are as in gemm_bf16.cpp: (panel, block of rows) from a shared counter; with one block
// each thread streams one contiguous run of panels.

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>  // bindings only (torch/extension.h builds twice as long)

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "gemm_tile.h"
#include "panel_bias.h"
#include "run_tasks.h"

#if defined(SGLANG_GEMM_TILE) && defined(__AVX512VNNI__)
#define SGLANG_INT8_TILE 1
#define SGLANG_COMPILED_ISA "avx512_vnni"
#elif defined(__AVX2__) && !defined(SGLANG_PORTABLE_KERNELS)
#include <immintrin.h>
#define SGLANG_INT8_AVX2 1
#define SGLANG_COMPILED_ISA "avx2"
#else
#define SGLANG_COMPILED_ISA "portable"
#endif
#if defined(__AVX2__) && !defined(SGLANG_PORTABLE_KERNELS)
#include <immintrin.h>
#define SGLANG_INT4_AVX2 1  // 8da4w's AVX2 path (and its helpers for the VNNI one)
#endif

#include "int8dq_rows.h"
#include "int8dq_int8.h"
#include "int8dq_int4.h"
#include "int8dq_peak.h"


PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("peak_ops", &peak_ops,
        "the int8 product's rate on every thread (vpdpbusd, or AVX2's vpmaddubsw chain; int8 "
        "operations per second; 0 for the portable build)",
        py::arg("seconds") = 0.5);
  m.def("isa", [] { return SGLANG_COMPILED_ISA; }, "The instruction set of this build");
  m.def("linear", &linear,
        "x quantized per row times W int8 per channel, in integers; plus bias -> (M, N)",
        py::arg("x"), py::arg("codes"), py::arg("offset"), py::arg("scale"), py::arg("bias"),
        py::arg("n"));
  m.def("linear_int4", &linear_int4,
        "x quantized per row times W int4 per group, in integers; plus bias -> (M, N)",
        py::arg("x"), py::arg("codes"), py::arg("scale"), py::arg("min"), py::arg("group"),
        py::arg("bias"), py::arg("n"));
  m.def("int4_isa", [] {
#if defined(SGLANG_INT8_TILE)
    return "avx512_vnni";
#elif defined(SGLANG_INT4_AVX2)
    return "avx2";
#else
    return "portable";
#endif
  }, "The instruction set of this build's int4 path");
}
