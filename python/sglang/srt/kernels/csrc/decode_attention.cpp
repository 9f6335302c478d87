// Decode attention over the engine's paged KV pool: one query token per request, all requests
// of a batch in one call, parallel over (request, KV head).
//
// Each task reads a request's keys once for all query heads that share its KV head (GQA), keeps
// the scores of the whole sequence (one float per key and head: a decode step's sequence fits in
// cache), and accumulates the values the same way. Accumulation is in float32 whatever the
// storage dtype. Dot products and axpys run over 16 independent lanes, a loop shape compilers
// vectorize without reassociating floats; the build uses -march=native, so the code is compiled
// for the ISA of the machine that loads it (the build cache is keyed by its CPU flags).
//
// bfloat16 pools on CPUs with AVX512-BF16 take their own task: scores with vdpbf16ps (32
// bfloat16 pairs per instruction, straight from the pool's rows), the softmax with a vector exp,
// P.V as float32 FMAs over each value row widened once for all the group's heads. float32 pools
// on CPUs with AVX2 and FMA take theirs: scores as 8-lane FMAs straight from the pool's rows
// (fetched a few keys ahead), the softmax with an AVX2 vector exp, P.V as 8-lane FMAs.

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>  // bindings only (torch/extension.h builds twice as long)

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "prefill_attention_tiles.h"  // to_float, kNegInf; vector_math.h

namespace {

using prefill_tiles::to_float;

constexpr int kLanes = 16;

template <typename T>
inline void load_row(const T* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

inline float dot(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {0};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  float sum = 0.f;
  for (int l = 0; l < kLanes; ++l) sum += acc[l];
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

inline void axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// One (request, KV head): the n keys and values at ``slots`` (rows of the pool with strides
// ``k_stride`` / ``v_stride`` per slot), the group's ``groups`` query rows, its output rows.
struct Task {
  const int64_t* slots;
  int64_t n, groups, dim, k_stride, v_stride;
  float scale, cap;
};

struct Scratch {
  std::vector<float> query, key, value, acc, scores, inv_total;
};

template <typename T>
void task_generic(const Task& t, const T* q, const T* k, const T* v, T* out, Scratch& w) {
  const int64_t groups = t.groups, dim = t.dim, n = t.n;
  w.query.resize(groups * dim), w.key.resize(dim), w.value.resize(dim), w.acc.resize(groups * dim);
  for (int64_t g = 0; g < groups; ++g) load_row(q + g * dim, w.query.data() + g * dim, dim);
  w.scores.assign(groups * n, 0.f);
  for (int64_t j = 0; j < n; ++j) {
    load_row(k + t.slots[j] * t.k_stride, w.key.data(), dim);
    for (int64_t g = 0; g < groups; ++g) {
      float s = dot(w.query.data() + g * dim, w.key.data(), dim) * t.scale;
      if (t.cap > 0.f) s = std::tanh(s / t.cap) * t.cap;
      w.scores[g * n + j] = s;
    }
  }
  for (int64_t g = 0; g < groups; ++g) {
    float* row = w.scores.data() + g * n;
    const float top = *std::max_element(row, row + n);
    float total = 0.f;
    for (int64_t j = 0; j < n; ++j) total += (row[j] = std::exp(row[j] - top));
    const float inv = 1.f / total;
    for (int64_t j = 0; j < n; ++j) row[j] *= inv;
  }
  std::fill(w.acc.begin(), w.acc.end(), 0.f);
  for (int64_t j = 0; j < n; ++j) {
    load_row(v + t.slots[j] * t.v_stride, w.value.data(), dim);
    for (int64_t g = 0; g < groups; ++g)
      axpy(w.scores[g * n + j], w.value.data(), w.acc.data() + g * dim, dim);
  }
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t i = 0; i < dim; ++i) out[g * dim + i] = static_cast<T>(w.acc[g * dim + i]);
}

#ifdef SGLANG_AVX2
#ifndef SGLANG_AVX512
#undef SGLANG_COMPILED_ISA
#define SGLANG_COMPILED_ISA "avx2"  // its float32 task: the build's one vector path
#endif

constexpr int64_t kAheadF32 = 8;  // rows of the pool are scattered: fetch this many keys ahead

inline void prefetch_f32_row(const float* row, int64_t dim) {
  for (int64_t i = 0; i < dim; i += 16)
    _mm_prefetch(reinterpret_cast<const char*>(row + i), _MM_HINT_T0);
}

using vec::exp_nonpositive8;
using vec::load8;
using vec::lanes_below;
using vec::store8;
using vec::sum8;

void task_f32(const Task& t, const float* q, const float* k, const float* v, float* out,
              Scratch& w) {
  const int64_t groups = t.groups, dim = t.dim, n = t.n;
  const float scale = t.scale, cap = t.cap;
  w.scores.resize(groups * n);
  w.acc.assign(groups * dim, 0.f);
  for (int64_t j = 0; j < n; ++j) {
    const float* row = k + t.slots[j] * t.k_stride;
    if (j + kAheadF32 < n) prefetch_f32_row(k + t.slots[j + kAheadF32] * t.k_stride, dim);
    for (int64_t g = 0; g < groups; ++g) {
      const float* qg = q + g * dim;
      __m256 even = _mm256_setzero_ps(), odd = _mm256_setzero_ps();
      int64_t c = 0;
      for (; c + 16 <= dim; c += 16) {
        even = _mm256_fmadd_ps(_mm256_loadu_ps(qg + c), _mm256_loadu_ps(row + c), even);
        odd = _mm256_fmadd_ps(_mm256_loadu_ps(qg + c + 8), _mm256_loadu_ps(row + c + 8), odd);
      }
      for (; c < dim; c += 8)
        even = _mm256_fmadd_ps(load8(qg + c, dim - c), load8(row + c, dim - c), even);
      float s = sum8(_mm256_add_ps(even, odd)) * scale;
      if (cap > 0.f) s = std::tanh(s / cap) * cap;
      w.scores[g * n + j] = s;
    }
  }
  w.inv_total.resize(groups);
  for (int64_t g = 0; g < groups; ++g) {
    float* row = w.scores.data() + g * n;
    const float top = *std::max_element(row, row + n);
    __m256 total = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j += 8) {
      const __m256 e = exp_nonpositive8(_mm256_sub_ps(load8(row + j, n - j), _mm256_set1_ps(top)));
      const __m256 kept = _mm256_and_ps(e, _mm256_castsi256_ps(lanes_below(n - j)));
      store8(row + j, kept, n - j);
      total = _mm256_add_ps(total, kept);
    }
    w.inv_total[g] = 1.f / sum8(total);
  }
  for (int64_t j = 0; j < n; ++j) {
    const float* row = v + t.slots[j] * t.v_stride;
    if (j + kAheadF32 < n) prefetch_f32_row(v + t.slots[j + kAheadF32] * t.v_stride, dim);
    for (int64_t g = 0; g < groups; ++g) {
      const __m256 p = _mm256_set1_ps(w.scores[g * n + j]);
      float* acc = w.acc.data() + g * dim;
      for (int64_t c = 0; c < dim; c += 8)
        store8(acc + c, _mm256_fmadd_ps(p, load8(row + c, dim - c), load8(acc + c, dim - c)),
               dim - c);
    }
  }
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t i = 0; i < dim; ++i) out[g * dim + i] = w.acc[g * dim + i] * w.inv_total[g];
}
#endif

#ifdef SGLANG_AVX512_BF16
constexpr int64_t kMaxBf16Dim = 256;  // value rows widened in registers: 16 vectors of 16

constexpr int64_t kAhead = 8;  // rows of the pool are scattered: fetch this many keys ahead

inline void prefetch_row(const uint16_t* row, int64_t dim) {
  for (int64_t i = 0; i < dim; i += 32)
    _mm_prefetch(reinterpret_cast<const char*>(row + i), _MM_HINT_T0);
}

inline __mmask32 pair_mask(int64_t left) {
  return left >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << left) - 1);
}

inline __mmask16 float_mask(int64_t left) {
  return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

void task_bf16(const Task& t, const c10::BFloat16* q16, const c10::BFloat16* k16,
               const c10::BFloat16* v16, c10::BFloat16* out, Scratch& w) {
  const auto* q = reinterpret_cast<const uint16_t*>(q16);
  const auto* k = reinterpret_cast<const uint16_t*>(k16);
  const auto* v = reinterpret_cast<const uint16_t*>(v16);
  const int64_t groups = t.groups, dim = t.dim, n = t.n;
  const int64_t pairs = (dim + 31) / 32, lanes = (dim + 15) / 16;
  w.scores.resize(groups * n);
  w.acc.assign(groups * lanes * 16, 0.f);
  // scores: each key row loaded once (pairs vectors), dotted with every query row of the group
  for (int64_t j = 0; j < n; ++j) {
    const uint16_t* row = k + t.slots[j] * t.k_stride;
    if (j + kAhead < n) prefetch_row(k + t.slots[j + kAhead] * t.k_stride, dim);
    __m512bh key[kMaxBf16Dim / 32];
    for (int64_t c = 0; c < pairs; ++c)
      key[c] = (__m512bh)_mm512_maskz_loadu_epi16(pair_mask(dim - 32 * c), row + 32 * c);
    for (int64_t g = 0; g < groups; ++g) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t c = 0; c < pairs; ++c) {
        const __m512bh qv =
            (__m512bh)_mm512_maskz_loadu_epi16(pair_mask(dim - 32 * c), q + g * dim + 32 * c);
        acc = _mm512_dpbf16_ps(acc, key[c], qv);
      }
      float s = _mm512_reduce_add_ps(acc) * t.scale;
      if (t.cap > 0.f) s = std::tanh(s / t.cap) * t.cap;
      w.scores[g * n + j] = s;
    }
  }
  // softmax numerators (the 1 / sum is applied to the output)
  w.inv_total.resize(groups);
  float* inv = w.inv_total.data();
  for (int64_t g = 0; g < groups; ++g) {
    float* row = w.scores.data() + g * n;
    __m512 top = _mm512_set1_ps(prefill_tiles::kNegInf);
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 m = float_mask(n - j);
      top = _mm512_mask_max_ps(top, m, top, _mm512_maskz_loadu_ps(m, row + j));
    }
    const __m512 high = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    __m512 total = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 m = float_mask(n - j);
      const __m512 e = _mm512_maskz_mov_ps(
          m, vec::exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + j), high)));
      _mm512_mask_storeu_ps(row + j, m, e);
      total = _mm512_add_ps(total, e);
    }
    inv[g] = 1.f / _mm512_reduce_add_ps(total);
  }
  // P.V: each value row widened to float32 once, then one FMA per (head, 16 lanes)
  for (int64_t j = 0; j < n; ++j) {
    const uint16_t* row = v + t.slots[j] * t.v_stride;
    if (j + kAhead < n) prefetch_row(v + t.slots[j + kAhead] * t.v_stride, dim);
    __m512 value[kMaxBf16Dim / 16];
    for (int64_t c = 0; c < lanes; ++c) {
      const __m256i half = _mm256_maskz_loadu_epi16(float_mask(dim - 16 * c), row + 16 * c);
      value[c] = vec::widen16(half);
    }
    for (int64_t g = 0; g < groups; ++g) {
      const __m512 p = _mm512_set1_ps(w.scores[g * n + j]);
      float* acc = w.acc.data() + g * lanes * 16;
      for (int64_t c = 0; c < lanes; ++c) {
        const __m512 sum = _mm512_fmadd_ps(p, value[c], _mm512_loadu_ps(acc + 16 * c));
        _mm512_storeu_ps(acc + 16 * c, sum);
      }
    }
  }
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t i = 0; i < dim; ++i)
      out[g * dim + i] = c10::BFloat16(w.acc[g * lanes * 16 + i] * inv[g]);
}
#endif

template <typename T>
void decode_attention_impl(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                           const at::Tensor& req_to_token, const at::Tensor& rows,
                           const at::Tensor& seq_lens, double scale, int64_t window,
                           double softcap, at::Tensor& out) {
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = k_buf.size(1);
  const int64_t groups = heads / kv_heads;
  const int64_t head_stride = k_buf.stride(1), v_head_stride = v_buf.stride(1);
  const int64_t table_stride = req_to_token.stride(0);
  const T* q_ptr = q.data_ptr<T>();
  const T* k_ptr = k_buf.data_ptr<T>();
  const T* v_ptr = v_buf.data_ptr<T>();
  const int64_t* table = req_to_token.data_ptr<int64_t>();
  const int64_t* row_ptr = rows.data_ptr<int64_t>();
  const int64_t* len_ptr = seq_lens.data_ptr<int64_t>();
  T* out_ptr = out.data_ptr<T>();

  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / kv_heads, kvh = task % kv_heads;
      const int64_t len = len_ptr[b];
      const int64_t first = window > 0 ? std::max<int64_t>(0, len - window) : 0;
      const Task t{table + row_ptr[b] * table_stride + first, len - first, groups, dim,
                   k_buf.stride(0), v_buf.stride(0), static_cast<float>(scale),
                   static_cast<float>(softcap)};
      const T* qg = q_ptr + (b * heads + kvh * groups) * dim;
      const T* kg = k_ptr + kvh * head_stride;
      const T* vg = v_ptr + kvh * v_head_stride;
      T* og = out_ptr + (b * heads + kvh * groups) * dim;
#ifdef SGLANG_AVX512_BF16
      if constexpr (std::is_same_v<T, c10::BFloat16>) {
        if (dim <= kMaxBf16Dim) {
          task_bf16(t, qg, kg, vg, og, scratch);
          continue;
        }
      }
#endif
#ifdef SGLANG_AVX2
      if constexpr (std::is_same_v<T, float>) {
        task_f32(t, qg, kg, vg, og, scratch);
        continue;
      }
#endif
      task_generic(t, qg, kg, vg, og, scratch);
    }
  });
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k_buf,
                            const at::Tensor& v_buf, const at::Tensor& req_to_token,
                            const at::Tensor& rows, const at::Tensor& seq_lens, double scale,
                            int64_t window, double softcap) {
  TORCH_CHECK(q.dim() == 3 && k_buf.dim() == 3 && v_buf.dim() == 3, "q (B,H,D), kv (S,KVH,D)");
  TORCH_CHECK(q.is_contiguous(), "q must be contiguous");
  TORCH_CHECK(k_buf.stride(2) == 1 && v_buf.stride(2) == 1, "KV rows must be contiguous");
  TORCH_CHECK(q.scalar_type() == k_buf.scalar_type() && q.scalar_type() == v_buf.scalar_type(),
              "q and the KV pool must share a dtype");
  TORCH_CHECK(q.size(1) % k_buf.size(1) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(q.size(2) == k_buf.size(2) && q.size(2) == v_buf.size(2), "head dims differ");
  TORCH_CHECK(req_to_token.scalar_type() == at::kLong && rows.scalar_type() == at::kLong &&
                  seq_lens.scalar_type() == at::kLong,
              "index tensors must be int64");
  TORCH_CHECK(req_to_token.stride(1) == 1 && rows.is_contiguous() && seq_lens.is_contiguous(),
              "index tensors must be contiguous");
  auto out = at::empty_like(q);
  if (q.scalar_type() == at::kFloat) {
    decode_attention_impl<float>(q, k_buf, v_buf, req_to_token, rows, seq_lens, scale, window,
                                 softcap, out);
  } else if (q.scalar_type() == at::kBFloat16) {
    decode_attention_impl<c10::BFloat16>(q, k_buf, v_buf, req_to_token, rows, seq_lens, scale,
                                         window, softcap, out);
  } else {
    TORCH_CHECK(false, "decode_attention takes float32 or bfloat16");
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("isa", [] { return SGLANG_COMPILED_ISA; }, "The instruction set of this build");
  m.def("decode_attention", &decode_attention,
        "Decode attention of one query per request over the paged KV pool");
}
