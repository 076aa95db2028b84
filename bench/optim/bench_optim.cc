// The optimizer step per element: fp32 AdamW (16 bytes of state per element read and written:
// master, m, v, and the gradient read) against AdamW with 8-bit moments (optim/moments8.h:
// master 4, codes 2, scales 8/256, gradient 4), at a size inside the last-level cache and one
// far past it (64 Mi elements: 1 GiB of fp32 state), on one thread and on two.
//
//   build/release/bench/optim/bench_optim
// `bytes_per_second` counts the state and gradient bytes each variant must move once.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "optim/adamw.h"
#include "optim/moments8.h"

namespace zerodp {
namespace {

std::vector<float> normal_vector(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// The time per element of `n` per iteration, as the "ns/element" counter.
void count_ns_per_element(benchmark::State& state, size_t n) {
  state.counters["ns/element"] = benchmark::Counter(
      static_cast<double>(state.iterations() * n),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert | benchmark::Counter::kAvgThreads);
}

void BM_AdamWFp32(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<float> master = normal_vector(n, 1, 0.02f), grad = normal_vector(n, 2, 1e-3f);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  const AdamWConfig c;
  int64_t step = 0;
  for (auto _ : state) {
    adamw_update({.master = master, .m = m, .v = v, .grad = grad}, true, c, ++step, 1.0f);
    benchmark::DoNotOptimize(master.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * (4 * 4 + 3 * 4)));
  count_ns_per_element(state, n);
}

void BM_AdamWInt8Moments(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<float> master = normal_vector(n, 1, 0.02f), grad = normal_vector(n, 2, 1e-3f);
  std::vector<uint8_t> m(n, 0), v(n, 0);
  std::vector<float> ms(moment_blocks(n, kMomentBlock), 0.0f), vs(ms.size(), 0.0f);
  const QuantizedMoments q{m, v, ms, vs, kMomentBlock};
  const AdamWConfig c;
  int64_t step = 0;
  for (auto _ : state) {
    adamw8_update(master, grad, q, true, c, ++step, 1.0f);
    benchmark::DoNotOptimize(master.data());
  }
  const size_t bytes = n * (4 + 2 + 4 + 4 + 2) + ms.size() * 16;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  count_ns_per_element(state, n);
}

// The two halves of the 8-bit update's extra work, both moments of a run: encoding (block
// maxima and codes) and decoding.
void BM_EncodeMoments(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const std::vector<float> m = normal_vector(n, 3, 1e-4f), g = normal_vector(n, 4, 1e-3f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = g[i] * g[i];
  std::vector<uint8_t> mc(n), vc(n);
  std::vector<float> ms(moment_blocks(n, kMomentBlock)), vs(ms.size());
  const QuantizedMoments q{mc, vc, ms, vs, kMomentBlock};
  for (auto _ : state) {
    quantize_moments(m, v, q);
    benchmark::DoNotOptimize(mc.data());
  }
  count_ns_per_element(state, n);
}

void BM_DecodeMoments(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> mc(n), vc(n);
  for (size_t i = 0; i < n; ++i) {
    mc[i] = static_cast<uint8_t>(i * 7);
    vc[i] = static_cast<uint8_t>(i * 13);
  }
  std::vector<float> ms(moment_blocks(n, kMomentBlock), 1e-3f), vs(ms.size(), 1e-6f);
  std::vector<float> m(n), v(n);
  const QuantizedMoments q{mc, vc, ms, vs, kMomentBlock};
  for (auto _ : state) {
    dequantize_moments(q, m, v);
    benchmark::DoNotOptimize(m.data());
  }
  count_ns_per_element(state, n);
}

// One thread; then two at once past the cache, as two ranks on two cores update together and
// share the memory bus (ns/element is then each thread's).
BENCHMARK(BM_AdamWFp32)->Arg(1 << 16)->Arg(1 << 26)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AdamWInt8Moments)->Arg(1 << 16)->Arg(1 << 26)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AdamWFp32)->Arg(1 << 26)->Threads(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AdamWInt8Moments)
    ->Arg(1 << 26)
    ->Threads(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeMoments)->Arg(1 << 12)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeMoments)->Arg(1 << 12)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace zerodp

BENCHMARK_MAIN();
