// Throughput of the bulk dtype conversions on every path this CPU has.
//
// One row per (direction, path, element count). GB/s counts bytes read plus bytes written
// (count * 6 for every direction). Each row also reports, like nccl-tests, its correctness and
// its peer: `wrong` is the number of elements whose bits differ from scalar::convert on the
// same input, and `x_scalar` is this row's speed over the scalar path's at the same count
// (rows run in registration order, scalar first; absent if the scalar row was filtered out).
// Inputs are N(0, 1) values, like weights and activations, so the scalar f16 path's
// branches predict the way they would in training.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "tensor/dtype.h"

namespace zerodp {
namespace {

template <typename T>
uint32_t bits_of(T x) {
  uint32_t b = 0;
  std::memcpy(&b, &x, sizeof(T));
  return b;
}

// The inputs of one element count, made once and shared by every row that uses it.
struct Inputs {
  std::vector<float> f32;
  std::vector<BFloat16> bf16;
  std::vector<Float16> f16;
  explicit Inputs(size_t count) : f32(count), bf16(count), f16(count) {
    std::mt19937 rng(12345);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : f32) x = normal(rng);
    scalar::convert(f32, std::span<BFloat16>(bf16));
    scalar::convert(f32, std::span<Float16>(f16));
  }
  template <typename T>
  const std::vector<T>& of() const {
    if constexpr (std::is_same_v<T, float>) {
      return f32;
    } else if constexpr (std::is_same_v<T, BFloat16>) {
      return bf16;
    } else {
      return f16;
    }
  }
};

const Inputs& inputs_for(size_t count) {
  static std::map<size_t, Inputs> cache;
  return cache.try_emplace(count, count).first->second;
}

// Seconds per call of the scalar row, keyed by (direction, count).
std::map<std::tuple<std::string, size_t>, double>& scalar_seconds() {
  static std::map<std::tuple<std::string, size_t>, double> seconds;
  return seconds;
}

template <typename In, typename Out>
using Kernel = void (*)(std::span<const In>, std::span<Out>);

template <typename In, typename Out>
void bench_conversion(benchmark::State& state, std::string direction, std::string path,
                      Kernel<In, Out> fn) {
  const auto count = static_cast<size_t>(state.range(0));
  const std::vector<In>& in = inputs_for(count).template of<In>();
  std::vector<Out> out(count);

  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    fn(in, out);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  const double seconds_per_call = elapsed.count() / static_cast<double>(state.iterations());

  std::vector<Out> want(count);
  scalar::convert(in, std::span<Out>(want));
  int64_t wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += bits_of(out[i]) != bits_of(want[i]) ? 1 : 0;

  const auto bytes_per_call = static_cast<double>(count * (sizeof(In) + sizeof(Out)));
  state.counters["GB/s"] = benchmark::Counter(
      bytes_per_call * static_cast<double>(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
  state.counters["wrong"] = static_cast<double>(wrong);
  const auto key = std::make_tuple(direction, count);
  if (path == "scalar") scalar_seconds()[key] = seconds_per_call;
  if (const auto it = scalar_seconds().find(key); it != scalar_seconds().end()) {
    state.counters["x_scalar"] = it->second / seconds_per_call;
  }
  if (wrong != 0) state.SetLabel("MISMATCH vs scalar");
}

template <typename In, typename Out>
void register_direction(const std::string& direction, Kernel<In, Out> ConversionKernels::*member) {
  // Scalar first so the other rows can report their ratio to it.
  const auto kernels = conversion_kernels();
  for (size_t r = kernels.size(); r-- > 0;) {
    const ConversionKernels& k = kernels[r];
    const std::string path(k.name);
    benchmark::RegisterBenchmark(("convert/" + direction + "/" + path).c_str(),
                                 [direction, path, fn = k.*member](benchmark::State& state) {
                                   bench_conversion<In, Out>(state, direction, path, fn);
                                 })
        ->Arg(int64_t{1} << 12)  // 24 KiB moved: L1/L2
        ->Arg(int64_t{1} << 18)  // 1.5 MiB: L2/L3
        ->Arg(int64_t{1} << 24)  // 96 MiB: DRAM
        ->UseRealTime();
  }
}

}  // namespace
}  // namespace zerodp

int main(int argc, char** argv) {
  using zerodp::BFloat16;
  using zerodp::ConversionKernels;
  using zerodp::Float16;
  zerodp::register_direction<float, BFloat16>("f32_to_bf16", &ConversionKernels::f32_to_bf16);
  zerodp::register_direction<float, Float16>("f32_to_f16", &ConversionKernels::f32_to_f16);
  zerodp::register_direction<BFloat16, float>("bf16_to_f32", &ConversionKernels::bf16_to_f32);
  zerodp::register_direction<Float16, float>("f16_to_f32", &ConversionKernels::f16_to_f32);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("conversion_path", std::string(zerodp::conversion_path()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
