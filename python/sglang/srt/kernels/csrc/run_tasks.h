// Dynamic scheduling of a kernel's tasks over torch's threads, shared by the kernels.

#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

// Runs task(t, worker) for t in [0, n) on all threads, each taking the next t when done with
// one (callers put costly tasks first); worker < at::get_num_threads() names its scratch.
template <typename F>
void run_tasks(int64_t n, const F& task) {
  std::atomic<int64_t> next{0};
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), n);
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t worker = begin; worker < end; ++worker)
      for (int64_t t; (t = next.fetch_add(1)) < n;) task(t, worker);
  });
}
