// SHA-256 block compression throughput, the portable rounds against the x86 SHA extensions
// (what Sha256 uses when the CPU has them), on the same 1 MiB of bytes. Checkpoints hash
// every byte they write and verify every byte they load, so this rate bounds how fast
// either can be. GB/s counts bytes hashed.
#include <benchmark/benchmark.h>

#include <array>
#include <cstdint>
#include <vector>

#include "core/sha256.h"

namespace zerodp {
namespace {

constexpr size_t kBytes = size_t{1} << 20;

std::vector<uint8_t> some_bytes() {
  std::vector<uint8_t> v(kBytes);
  uint32_t x = 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

template <void (*Compress)(std::array<uint32_t, 8>&, const uint8_t*, size_t)>
void BM_Compress(benchmark::State& state) {
  const std::vector<uint8_t> bytes = some_bytes();
  std::array<uint32_t, 8> h{};
  for (auto _ : state) {
    Compress(h, bytes.data(), kBytes / 64);
    benchmark::DoNotOptimize(h);
  }
  state.counters["GB/s"] = benchmark::Counter(
      static_cast<double>(kBytes) * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

void BM_Sha256Update(benchmark::State& state) {
  const std::vector<uint8_t> bytes = some_bytes();
  for (auto _ : state) {
    Sha256 h;
    h.update(bytes.data(), bytes.size());
    benchmark::DoNotOptimize(h.digest());
  }
  state.counters["GB/s"] = benchmark::Counter(
      static_cast<double>(kBytes) * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

void register_all() {
  benchmark::RegisterBenchmark("compress/portable", BM_Compress<sha256_detail::compress_portable>);
  if (sha256_detail::cpu_has_sha_extensions()) {
    benchmark::RegisterBenchmark("compress/sha_extensions",
                                 BM_Compress<sha256_detail::compress_sha_extensions>);
  }
  benchmark::RegisterBenchmark("Sha256::update", BM_Sha256Update);
}

}  // namespace
}  // namespace zerodp

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  zerodp::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
