// Causal prefill (extend) attention over the engine's paged KV pool, all requests of a batch in
// one call. Request i's queries are rows [q_start, q_start + q_len) of q at sequence positions
// [prefix, prefix + q_len); its keys and values sit at the pool slots req_to_token[row, :seq_len].
//
// Two phases, each spread over threads by a shared counter (KV head by KV head, costliest
// tasks first):
// 1. Pack: per (request, KV head, block of kKeys keys), the scattered K/V rows are copied once
//    into contiguous blocks in the layout the dot products want (zero-padded to whole key
//    tiles, packed_keys).
// 2. Attend: per (request, KV head, block of query positions), the rows of all query heads of
//    the KV group (GQA: K/V read once for all of them) take flash-style passes over the key
//    blocks they may see: scores, online softmax in float32 (running max and sum), P.V
//    accumulated in float32. Key blocks wholly outside the causal mask or the window are skipped.
//
// The block layouts and micro-kernels, chosen at compile time for the ISA present
// (-march=native), are in prefill_attention_tiles.h: bfloat16 pairs for vdpbf16ps where
// AVX512-BF16 is present (P is then rounded to bfloat16), float32 blocks otherwise (16-lane
// FMAs with AVX-512, 8-lane ones with AVX2 alone).
//
// varlen_attention runs the same code without a pool or a mask: bidirectional attention within
// each segment [cu[i], cu[i+1]) of packed tokens (the vision towers' windows and images), keys
// read straight from k and v rows. Segments of at most kLocalKeys tokens skip phase 1: one task
// per (segment, KV head) packs into its worker's scratch and attends all the segment's queries.

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>  // bindings only (torch/extension.h builds twice as long)

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <type_traits>
#include <vector>

#include "prefill_attention_tiles.h"
#include "run_tasks.h"

#ifdef SGLANG_TILES_AVX2
#undef SGLANG_COMPILED_ISA
#define SGLANG_COMPILED_ISA "avx2"
#endif

namespace {

using namespace prefill_tiles;

constexpr int64_t kTaskRows = 32;  // query rows (positions x heads of a KV group) per task
// Bidirectional requests of at most this many keys are one task per KV head, which packs the
// K/V blocks into its worker's scratch and attends all their queries: for many short segments
// (vision windows) this beats shared buffers, whose first touch costs more than the attention.
constexpr int64_t kLocalKeys = 2 * kKeys;

// Query positions per task: rows (positions x groups) the multiple of lcm(groups, kRowTile)
// nearest kTaskRows, so that no micro-kernel call takes a short tail of rows (GQA groups of 6:
// 36 rows, not 30 = 7 x 4 + 2; 2-3% faster on a 433-token prompt after a 1,400-3,300 prefix).
inline int64_t task_positions(int64_t groups) {
  const int64_t unit = std::lcm<int64_t>(groups, kRowTile);  // rows of whole tiles and groups
  return std::max<int64_t>(1, (kTaskRows + unit / 2) / unit) * unit / groups;
}

// ---- the batch ----
struct Request {
  int64_t row, q_start, prefix, q_len;
  int64_t first_block;  // first key block any of its queries sees (sliding window)
  int64_t blocks;       // packed key blocks from first_block on
  int64_t packed;       // index of its first packed block (KV head 0) in the shared buffers
  bool packs_locally = false;  // short and bidirectional: each task packs its own K/V
  int64_t seq_len() const { return prefix + q_len; }
};

struct Problem {
  std::vector<Request> reqs;
  int64_t heads, kv_heads, groups, dim, window;  // window <= 0: none
  float scale;
  bool causal;  // false: every query of a request sees all its keys (no window)
};

// Keys any query position in [p0, last] of request r may see end here.
inline int64_t key_end(const Problem& pb, const Request& r, int64_t last) {
  return pb.causal ? last + 1 : r.seq_len();
}

// Row pointers and strides of q, k and v ((tokens, heads, dim), rows contiguous) and out
// (contiguous, like q).
template <typename T>
struct Operands {
  const T *q, *k, *v;
  int64_t q_stride0, q_stride1, k_stride0, k_stride1, v_stride0, v_stride1;
  T* out;

  static Operands of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     at::Tensor& out) {
    return {q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(), q.stride(0), q.stride(1),
            k.stride(0),     k.stride(1),     v.stride(0),     v.stride(1), out.data_ptr<T>()};
  }
};

// A request's keys in [lo, hi) that query position pos may see.
inline int64_t first_visible(int64_t pos, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
}

template <typename Layout, int NV>
void pv_rows(const typename Layout::Elem* p, const typename Layout::Elem* v, int64_t rows,
             int64_t dim, int64_t n, int64_t d0, float* acc) {
  int64_t r = 0;
  for (; r + kRowTile <= rows; r += kRowTile)
    Layout::template pv<kRowTile, NV>(p + r * kKeys, v, dim, n, d0, acc + r * dim);
  const int64_t left = rows - r;
  p += r * kKeys, acc += r * dim;
  if (left == 3) Layout::template pv<3, NV>(p, v, dim, n, d0, acc);
  if (left == 2) Layout::template pv<2, NV>(p, v, dim, n, d0, acc);
  if (left == 1) Layout::template pv<1, NV>(p, v, dim, n, d0, acc);
}

// Scores of rows [0, rows) for the keys from h on, 16 NK of them.
template <typename Layout, int NK>
void qk_tile(const typename Layout::Elem* q, const typename Layout::Elem* k, int64_t rows,
             int64_t dim, int64_t h, float* scores) {
  int64_t r = 0;
  for (; r + kRowTile <= rows; r += kRowTile)
    Layout::template qk<kRowTile, NK>(q + r * dim, k, dim, h, scores + r * kKeys);
  const int64_t left = rows - r;
  const auto* q_left = q + r * dim;
  float* s_left = scores + r * kKeys;
  if (left == 3) Layout::template qk<3, NK>(q_left, k, dim, h, s_left);
  if (left == 2) Layout::template qk<2, NK>(q_left, k, dim, h, s_left);
  if (left == 1) Layout::template qk<1, NK>(q_left, k, dim, h, s_left);
}

// Scores of all rows for the block's first `keys` keys (rounded up to whole tiles: kKeyTile,
// or kTailTile where at most that many are left).
template <typename Layout>
void qk_rows(const typename Layout::Elem* q, const typename Layout::Elem* k, int64_t rows,
             int64_t dim, int64_t keys, float* scores) {
  for (int64_t h = 0; h < keys; h += kKeyTile) {
    if (keys - h > kTailTile)
      qk_tile<Layout, kKeyTile / 16>(q, k, rows, dim, h, scores);
    else
      qk_tile<Layout, kTailTile / 16>(q, k, rows, dim, h, scores);
  }
}

template <typename Layout>
void pv_all_dims(const typename Layout::Elem* p, const typename Layout::Elem* v, int64_t rows,
                 int64_t dim, int64_t n, float* acc) {
  for (int64_t d0 = 0, vectors; d0 < dim; d0 += 16 * vectors) {
    // 5 vectors left (head dim 80, the Qwen-VL towers'): one pass of 5, not 4 and then 1
    const int64_t left = (dim - d0) / 16;
    vectors = left == 5 ? 5 : std::min<int64_t>(kDimTile, left);
    if (vectors == 5) pv_rows<Layout, 5>(p, v, rows, dim, n, d0, acc);
    if (vectors == 4) pv_rows<Layout, 4>(p, v, rows, dim, n, d0, acc);
    if (vectors == 3) pv_rows<Layout, 3>(p, v, rows, dim, n, d0, acc);
    if (vectors == 2) pv_rows<Layout, 2>(p, v, rows, dim, n, d0, acc);
    if (vectors == 1) pv_rows<Layout, 1>(p, v, rows, dim, n, d0, acc);
  }
}

// A worker's buffers, reused across its tasks.
template <typename Elem>
struct Scratch {
  std::vector<float> scores, acc, row_max, row_sum;  // row_sum: 16 partial sums per row
  std::vector<Elem> q_rows, p, k_local, v_local;     // k/v_local: blocks packed by a task

  Scratch(int64_t rows, int64_t dim)
      : scores(rows * kKeys), acc(rows * dim), row_max(rows), row_sum(rows * 16),
        q_rows(rows * dim), p(rows * kKeys), k_local(kLocalKeys * dim), v_local(kLocalKeys * dim) {}
};

// Query positions [p0, p0 + positions) of request `req`, all heads of KV head `kvh`, whose key
// blocks from req.first_block on are packed at k_blocks and v_blocks.
template <typename Layout, typename T>
void attend(const Problem& pb, const Request& req, int64_t kvh, int64_t p0, int64_t positions,
            const Operands<T>& ops, const typename Layout::Elem* k_blocks,
            const typename Layout::Elem* v_blocks, Scratch<typename Layout::Elem>& sc) {
  using Elem = typename Layout::Elem;
  auto& q_rows = sc.q_rows;
  auto& p = sc.p;
  const int64_t dim = pb.dim, groups = pb.groups, rows = positions * groups;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t token = req.q_start + p0 - req.prefix + r / groups;
    const T* src = ops.q + token * ops.q_stride0 + (kvh * groups + r % groups) * ops.q_stride1;
    copy_row(src, dim, q_rows.data() + r * dim);
  }
  std::fill(sc.acc.begin(), sc.acc.begin() + rows * dim, 0.f);
  std::fill(sc.row_max.begin(), sc.row_max.begin() + rows, kNegInf);
  std::fill(sc.row_sum.begin(), sc.row_sum.begin() + rows * 16, 0.f);
  const int64_t keys_end = key_end(pb, req, p0 + positions - 1);
  const int64_t block_begin = first_visible(p0, pb.window) / kKeys;
  const int64_t block_end = (keys_end + kKeys - 1) / kKeys, block_elems = kKeys * dim;
  for (int64_t b = block_begin; b < block_end; ++b) {
    const int64_t key0 = b * kKeys;
    const int64_t used = std::min(kKeys, keys_end - key0);  // keys any row of the task may see
    const int64_t slot = b - req.first_block;
    qk_rows<Layout>(q_rows.data(), k_blocks + slot * block_elems, rows, dim, used,
                    sc.scores.data());
    const int64_t n_padded = (used + Layout::kKeyStep - 1) / Layout::kKeyStep * Layout::kKeyStep;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t pos = p0 + r / groups;
      const int64_t j0 = std::max<int64_t>(first_visible(pos, pb.window) - key0, 0);
      const int64_t j1 = std::min<int64_t>(key_end(pb, req, pos) - key0, used);
      softmax_step(sc.scores.data() + r * kKeys, j0, std::max(j0, j1), n_padded, pb.scale,
                   sc.row_max[r], sc.row_sum.data() + r * 16, sc.acc.data() + r * dim, dim,
                   p.data() + r * kKeys);
    }
    pv_all_dims<Layout>(p.data(), v_blocks + slot * block_elems, rows, dim, n_padded,
                        sc.acc.data());
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t token = req.q_start + p0 - req.prefix + r / groups;
    T* dst = ops.out + (token * pb.heads + kvh * groups + r % groups) * dim;
    const float* lanes = sc.row_sum.data() + r * 16;
    const float inv = 1.f / std::accumulate(lanes, lanes + 16, 0.f);
    store_scaled(sc.acc.data() + r * dim, inv, dim, dst);
  }
}

// Packs key blocks [b_begin, b_end) of request r, KV head kvh, from block b_begin on at k_dst
// and v_dst; key_row(r, j) is the row of k and v that holds its key at sequence position j.
template <typename Layout, typename T, typename KeyRow>
void pack_blocks(const Request& r, int64_t kvh, int64_t b_begin, int64_t b_end, int64_t dim,
                 const Operands<T>& ops, const KeyRow& key_row, typename Layout::Elem* k_dst,
                 typename Layout::Elem* v_dst) {
  for (int64_t b = b_begin; b < b_end; ++b) {
    const int64_t key0 = b * kKeys, n = std::min(kKeys, r.seq_len() - key0);
    const T* keys[kKeys];
    const T* values[kKeys];
    for (int64_t j = 0; j < n; ++j) {
      const int64_t row = key_row(r, key0 + j);
      keys[j] = ops.k + row * ops.k_stride0 + kvh * ops.k_stride1;
      values[j] = ops.v + row * ops.v_stride0 + kvh * ops.v_stride1;
    }
    for (int64_t j = 0; j < n; ++j)  // scattered rows: V's loads start while K is packed
      for (int64_t at = 0; at < dim * static_cast<int64_t>(sizeof(T)); at += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(values[j]) + at);
    Layout::pack_k(keys, n, dim, k_dst + (b - b_begin) * kKeys * dim);
    Layout::pack_v(values, n, dim, v_dst + (b - b_begin) * kKeys * dim);
  }
}

// Both phases for the requests of pb (see pack_blocks for key_row).
template <typename Layout, typename T, typename KeyRow>
void attention_impl(Problem& pb, const Operands<T>& ops, const KeyRow& key_row) {
  using Elem = typename Layout::Elem;
  const int64_t dim = pb.dim, kv_heads = pb.kv_heads, block_elems = kKeys * dim;
  int64_t total_blocks = 0;
  std::vector<std::pair<int64_t, int64_t>> packs;  // (request, block) in the shared buffers
  for (int64_t i = 0; i < static_cast<int64_t>(pb.reqs.size()); ++i) {
    Request& r = pb.reqs[i];
    r.first_block = first_visible(r.prefix, pb.window) / kKeys;
    r.blocks = (r.seq_len() + kKeys - 1) / kKeys - r.first_block;
    r.packs_locally = !pb.causal && r.seq_len() <= kLocalKeys;
    if (r.packs_locally) continue;
    r.packed = total_blocks * kv_heads;
    total_blocks += r.blocks;
    for (int64_t b = r.first_block; b < r.first_block + r.blocks; ++b) packs.emplace_back(i, b);
  }
  // Left uninitialized: packing writes every element the micro-kernels read (packed_keys).
  const std::unique_ptr<Elem[]> k_pack(new Elem[total_blocks * kv_heads * block_elems]);
  const std::unique_ptr<Elem[]> v_pack(new Elem[total_blocks * kv_heads * block_elems]);
  auto shared_blocks = [&](const Request& r, int64_t kvh) {
    return (r.packed + kvh * r.blocks) * block_elems;
  };
  run_tasks(static_cast<int64_t>(packs.size()) * kv_heads, [&](int64_t t, int64_t) {
    const auto [i, b] = packs[t / kv_heads];
    const int64_t kvh = t % kv_heads;
    const Request& r = pb.reqs[i];
    const int64_t at = shared_blocks(r, kvh) + (b - r.first_block) * block_elems;
    pack_blocks<Layout>(r, kvh, b, b + 1, dim, ops, key_row, k_pack.get() + at,
                        v_pack.get() + at);
  });

  struct Task {
    int64_t req, p0, positions, cost;
  };
  std::vector<Task> tasks;
  const int64_t positions = task_positions(pb.groups);
  for (int64_t i = 0; i < static_cast<int64_t>(pb.reqs.size()); ++i) {
    const Request& r = pb.reqs[i];
    const int64_t step = r.packs_locally ? r.q_len : positions;
    for (int64_t p0 = r.prefix; p0 < r.seq_len(); p0 += step) {
      const int64_t n = std::min(step, r.seq_len() - p0);
      const int64_t keys = key_end(pb, r, p0 + n - 1) - first_visible(p0, pb.window);
      tasks.push_back({i, p0, n, keys * n});
    }
  }
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& a, const Task& b) { return a.cost > b.cost; });
  std::vector<Scratch<Elem>> scratch;
  for (int64_t w = 0; w < at::get_num_threads(); ++w)
    scratch.emplace_back(positions * pb.groups, dim);
  // KV head outermost: a worker's next task reads the K/V blocks its last one read (in L2)
  const int64_t per_head = static_cast<int64_t>(tasks.size());
  run_tasks(per_head * kv_heads, [&](int64_t t, int64_t w) {
    const Task& task = tasks[t % per_head];
    const Request& r = pb.reqs[task.req];
    const int64_t kvh = t / per_head;
    Scratch<Elem>& sc = scratch[w];
    const Elem* k_blocks = k_pack.get() + shared_blocks(r, kvh);
    const Elem* v_blocks = v_pack.get() + shared_blocks(r, kvh);
    if (r.packs_locally) {
      pack_blocks<Layout>(r, kvh, r.first_block, r.first_block + r.blocks, dim, ops, key_row,
                          sc.k_local.data(), sc.v_local.data());
      k_blocks = sc.k_local.data(), v_blocks = sc.v_local.data();
    }
    const int64_t end = task.p0 + task.positions;
    for (int64_t p0 = task.p0; p0 < end; p0 += positions)
      attend<Layout, T>(pb, r, kvh, p0, std::min(positions, end - p0), ops, k_blocks, v_blocks,
                        sc);
  });
}

// attention_impl with the block layout of q's dtype on this ISA.
template <typename KeyRow>
void dispatch(Problem& pb, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
              at::Tensor& out, const KeyRow& key_row) {
  if (q.scalar_type() == at::kFloat) {
    attention_impl<FloatLayout>(pb, Operands<float>::of(q, k, v, out), key_row);
  } else if (q.scalar_type() == at::kBFloat16) {
    const auto ops = Operands<c10::BFloat16>::of(q, k, v, out);
#ifdef SGLANG_AVX512_BF16
    attention_impl<PairLayout>(pb, ops, key_row);
#else
    attention_impl<FloatLayout>(pb, ops, key_row);
#endif
  } else {
    TORCH_CHECK(false, "the attention kernels take float32 or bfloat16");
  }
}

// Shapes, strides and dtypes that both entries require of out, q and the keys and values.
Problem check_operands(const at::Tensor& out, const at::Tensor& q, const at::Tensor& k,
                       const at::Tensor& v, double scale) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "q (T,H,D), kv (S,KVH,D)");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1 && v.stride(2) == 1,
              "rows of q and KV must be contiguous");
  TORCH_CHECK(out.sizes() == q.sizes() && out.is_contiguous() &&
                  out.scalar_type() == q.scalar_type(),
              "out must be a contiguous tensor like q");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "q and the KV pool must share a dtype");
  TORCH_CHECK(k.size(1) == v.size(1) && q.size(1) % k.size(1) == 0,
              "query heads must be a multiple of KV heads");
  TORCH_CHECK(q.size(2) == k.size(2) && q.size(2) == v.size(2), "head dims differ");
  TORCH_CHECK(q.size(2) % 16 == 0, "head dim must be a multiple of 16");
  TORCH_CHECK(scale > 0, "the scale must be positive");
  Problem pb;
  pb.heads = q.size(1), pb.kv_heads = k.size(1), pb.groups = pb.heads / pb.kv_heads;
  pb.dim = q.size(2), pb.scale = static_cast<float>(scale);
  return pb;
}

void prefill_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_buf,
                       const at::Tensor& v_buf, const at::Tensor& req_to_token,
                       const at::Tensor& rows, const at::Tensor& q_starts,
                       const at::Tensor& prefix_lens, const at::Tensor& q_lens, double scale,
                       int64_t window) {
  Problem pb = check_operands(out, q, k_buf, v_buf, scale);
  pb.window = window, pb.causal = true;
  for (const at::Tensor* t : {&req_to_token, &rows, &q_starts, &prefix_lens, &q_lens})
    TORCH_CHECK(t->scalar_type() == at::kLong, "index tensors must be int64");
  TORCH_CHECK(req_to_token.stride(1) == 1, "req_to_token rows must be contiguous");
  const int64_t batch = rows.numel();
  TORCH_CHECK(q_starts.numel() == batch && prefix_lens.numel() == batch && q_lens.numel() == batch,
              "one row, q start, prefix and q length per request");
  auto rows_c = rows.contiguous(), starts_c = q_starts.contiguous();
  auto prefix_c = prefix_lens.contiguous(), lens_c = q_lens.contiguous();
  for (int64_t i = 0; i < batch; ++i) {
    Request r{rows_c.data_ptr<int64_t>()[i], starts_c.data_ptr<int64_t>()[i],
              prefix_c.data_ptr<int64_t>()[i], lens_c.data_ptr<int64_t>()[i], 0, 0, 0};
    TORCH_CHECK(r.prefix >= 0 && r.q_start >= 0 && r.q_start + r.q_len <= q.size(0) &&
                    r.seq_len() <= req_to_token.size(1),
                "a request's queries or keys are out of range");
    if (r.q_len > 0) pb.reqs.push_back(r);
  }
  const int64_t* table = req_to_token.data_ptr<int64_t>();
  const int64_t table_stride = req_to_token.stride(0);
  dispatch(pb, q, k_buf, v_buf, out,
           [&](const Request& r, int64_t j) { return table[r.row * table_stride + j]; });
}

void varlen_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k,
                      const at::Tensor& v, const at::Tensor& cu_seqlens, double scale) {
  Problem pb = check_operands(out, q, k, v, scale);
  pb.window = -1, pb.causal = false;
  TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0), "q, k and v differ in tokens");
  const auto cu = cu_seqlens.to(at::kLong).contiguous();
  const int64_t* bounds = cu.data_ptr<int64_t>();
  for (int64_t i = 0; i + 1 < cu.numel(); ++i) {
    TORCH_CHECK(0 <= bounds[i] && bounds[i] <= bounds[i + 1] && bounds[i + 1] <= q.size(0),
                "cu_seqlens must rise within the tokens");
    if (bounds[i + 1] > bounds[i])
      pb.reqs.push_back({i, bounds[i], 0, bounds[i + 1] - bounds[i], 0, 0, 0});
  }
  dispatch(pb, q, k, v, out, [](const Request& r, int64_t j) { return r.q_start + j; });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("isa", [] { return SGLANG_COMPILED_ISA; }, "The instruction set of this build");
  m.def("prefill_attention", &prefill_attention,
        "Causal prefill attention of a batch of requests over the paged KV pool, into out");
  m.def("varlen_attention", &varlen_attention,
        "Bidirectional attention within each segment [cu[i], cu[i+1]) of the tokens, into out");
}
