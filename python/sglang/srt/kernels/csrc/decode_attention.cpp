// Decode attention over the engine's paged KV pool: one query token per request, all requests
// of a batch in one call, parallel over (request, KV head).
//
// Each task reads a request's keys once for all query heads that share its KV head (GQA), keeps
// the scores of the whole sequence (one float per key and head: a decode step's sequence fits in
// cache), and accumulates the values the same way. Accumulation is in float32 whatever the
// storage dtype. Dot products and axpys run over 16 independent lanes, a loop shape compilers
// vectorize without reassociating floats; the build uses -march=native, so the code is compiled
// for the ISA of the machine that loads it (the build cache is keyed by its CPU flags).

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int kLanes = 16;

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) { return static_cast<float>(x); }

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

template <typename T>
void decode_attention_impl(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                           const at::Tensor& req_to_token, const at::Tensor& rows,
                           const at::Tensor& seq_lens, double scale, int64_t window,
                           double softcap, at::Tensor& out) {
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = k_buf.size(1);
  const int64_t groups = heads / kv_heads;
  const int64_t slot_stride = k_buf.stride(0), head_stride = k_buf.stride(1);
  const int64_t v_slot_stride = v_buf.stride(0), v_head_stride = v_buf.stride(1);
  const int64_t table_stride = req_to_token.stride(0);
  const T* q_ptr = q.data_ptr<T>();
  const T* k_ptr = k_buf.data_ptr<T>();
  const T* v_ptr = v_buf.data_ptr<T>();
  const int64_t* table = req_to_token.data_ptr<int64_t>();
  const int64_t* row_ptr = rows.data_ptr<int64_t>();
  const int64_t* len_ptr = seq_lens.data_ptr<int64_t>();
  T* out_ptr = out.data_ptr<T>();
  const float fscale = static_cast<float>(scale), cap = static_cast<float>(softcap);

  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> query(groups * dim), key(dim), value(dim), acc(groups * dim), scores;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / kv_heads, kvh = task % kv_heads;
      const int64_t len = len_ptr[b];
      const int64_t first = window > 0 ? std::max<int64_t>(0, len - window) : 0;
      const int64_t n = len - first;
      const int64_t* slots = table + row_ptr[b] * table_stride + first;
      for (int64_t g = 0; g < groups; ++g)
        load_row(q_ptr + (b * heads + kvh * groups + g) * dim, query.data() + g * dim, dim);
      scores.assign(groups * n, 0.f);
      for (int64_t t = 0; t < n; ++t) {
        load_row(k_ptr + slots[t] * slot_stride + kvh * head_stride, key.data(), dim);
        for (int64_t g = 0; g < groups; ++g) {
          float s = dot(query.data() + g * dim, key.data(), dim) * fscale;
          if (cap > 0.f) s = std::tanh(s / cap) * cap;
          scores[g * n + t] = s;
        }
      }
      for (int64_t g = 0; g < groups; ++g) {
        float* row = scores.data() + g * n;
        const float top = *std::max_element(row, row + n);
        float total = 0.f;
        for (int64_t t = 0; t < n; ++t) total += (row[t] = std::exp(row[t] - top));
        const float inv = 1.f / total;
        for (int64_t t = 0; t < n; ++t) row[t] *= inv;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = 0; t < n; ++t) {
        load_row(v_ptr + slots[t] * v_slot_stride + kvh * v_head_stride, value.data(), dim);
        for (int64_t g = 0; g < groups; ++g)
          axpy(scores[g * n + t], value.data(), acc.data() + g * dim, dim);
      }
      for (int64_t g = 0; g < groups; ++g) {
        T* dst = out_ptr + (b * heads + kvh * groups + g) * dim;
        for (int64_t i = 0; i < dim; ++i) dst[i] = static_cast<T>(acc[g * dim + i]);
      }
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
  m.def("decode_attention", &decode_attention,
        "Decode attention of one query per request over the paged KV pool");
}
