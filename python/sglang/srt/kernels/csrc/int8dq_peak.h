// The int8 peak probe (`peak_ops`): vpdpbusd's or vpmaddubsw's own rate on every thread.
// Part of linear_int8dq.cpp (included once, after its ISA macros).
#pragma once

namespace {

// The instruction's own rate, the int8 peak that MFU is counted against: on every thread,
// kPeakChains independent vpdpbusd chains in registers (no product waits for another) for about
// `seconds`; operations per second over all threads, a multiply-add counted as two (128 per
// instruction). 0 where this build has no VNNI path.
constexpr int kPeakChains = 12;

double peak_ops(double seconds) {
#ifdef SGLANG_INT8_TILE
  const int threads = at::get_num_threads();
  std::vector<double> rates(threads, 0.0);
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      __m512i acc[kPeakChains];
      for (int c = 0; c < kPeakChains; ++c) acc[c] = _mm512_setzero_si512();
      const __m512i x = _mm512_set1_epi8(1), w = _mm512_set1_epi8(2);
      const auto start = std::chrono::steady_clock::now();
      int64_t rounds = 0;
      double elapsed = 0.0;
      do {
        for (int i = 0; i < 4096; ++i) {
#pragma GCC unroll 12
          for (int c = 0; c < kPeakChains; ++c)
            asm volatile("vpdpbusd %2, %1, %0" : "+v"(acc[c]) : "v"(x), "v"(w));
        }
        rounds += 4096;
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      } while (elapsed < seconds);
      int32_t sink[16];
      __m512i total = acc[0];
      for (int c = 1; c < kPeakChains; ++c) total = _mm512_add_epi32(total, acc[c]);
      _mm512_storeu_si512(sink, total);
      volatile int32_t keep = sink[0];
      (void)keep;
      rates[t] = static_cast<double>(rounds) * kPeakChains * 128 / elapsed;
    }
  });
  double total = 0.0;
  for (double rate : rates) total += rate;
  return total;
#elif defined(SGLANG_INT8_AVX2)
  // The AVX2 product's own chain (vpmaddubsw, vpmaddwd, vpaddd: 32 multiply-adds), kPeakChains
  // of them independent, operations per second over all threads.
  const int threads = at::get_num_threads();
  std::vector<double> rates(threads, 0.0);
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      __m256i acc[kPeakChains];
      for (int c = 0; c < kPeakChains; ++c) acc[c] = _mm256_setzero_si256();
      const __m256i x = _mm256_set1_epi8(1), w = _mm256_set1_epi8(2), ones = _mm256_set1_epi16(1);
      const auto start = std::chrono::steady_clock::now();
      int64_t rounds = 0;
      double elapsed = 0.0;
      do {
        for (int i = 0; i < 4096; ++i) {
#pragma GCC unroll 12
          for (int c = 0; c < kPeakChains; ++c) {
            __m256i s;  // one product per chain and round (asm: the compiler cannot hoist it)
            asm volatile("vpmaddubsw %2, %1, %0" : "=x"(s) : "x"(x), "x"(w));
            acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(s, ones));
          }
        }
        rounds += 4096;
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      } while (elapsed < seconds);
      alignas(32) int32_t sink[8];
      __m256i total = acc[0];
      for (int c = 1; c < kPeakChains; ++c) total = _mm256_add_epi32(total, acc[c]);
      _mm256_store_si256(reinterpret_cast<__m256i*>(sink), total);
      volatile int32_t keep = sink[0];
      (void)keep;
      rates[t] = static_cast<double>(rounds) * kPeakChains * 64 / elapsed;
    }
  });
  double total = 0.0;
  for (double rate : rates) total += rate;
  return total;
#else
  (void)seconds;
  return 0.0;
#endif
}

}  // namespace
