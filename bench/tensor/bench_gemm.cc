// gemm throughput: zerodp::gemm against oneDNN's own threading and OpenBLAS, on the GPT
// shapes, with 1 and 2 threads, and with 2 rank threads sharing the cores.
//
// Each row reports GFLOP/s and, like nccl-tests' #wrong, whether its result has the same bits
// as zerodp::gemm on one thread (`same_bits`) and the largest difference (`max_abs_diff`).
// zerodp::gemm must show same_bits = 1 at every thread count; the others need not.
//
//   bench_gemm --benchmark_filter=gpt_medium        one model's shapes
//   OMP_WAIT_POLICY=passive bench_gemm --benchmark_filter=ranks
//
// OpenBLAS reads OPENBLAS_CORETYPE (Haswell in this environment): its rows show what the
// pinned kernel gives, which is why zerodp does not use it.
//
// Measured on the 2-core Zen 5 dev VM (shared with other builds; best of 60-100 calls, GFLOP/s,
// GPT-small and -medium shapes): one thread: zerodp 166-191, dnnl_sgemm 164-200, OpenBLAS
// 92-99. Two threads: zerodp 300-390, dnnl_sgemm 320-400 (but 12-80 whenever another process
// competes for the cores: its OpenMP team spins; OMP_WAIT_POLICY=passive avoids that),
// OpenBLAS 170-200. Two rank threads with 1 gemm thread each: 300-375 in total, no better with
// 2 each.
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tensor/gemm.h"

namespace zerodp {
namespace {

struct Shape {
  const char* model;  // which model and layer the product comes from
  const char* layer;
  Transpose ta;
  Transpose tb;
  size_t M, N, K;
};

constexpr Transpose kN = Transpose::kNo;
constexpr Transpose kT = Transpose::kYes;

// Forward products are inp (BT, C) @ W^T: NT. Weight gradients are dout^T @ inp: TN.
const Shape kShapes[] = {
    {"square", "1024", kN, kN, 1024, 1024, 1024},
    {"gpt_small", "qkv", kN, kT, 1024, 384, 128},
    {"gpt_small", "fc", kN, kT, 1024, 512, 128},
    {"gpt_small", "fcproj", kN, kT, 1024, 128, 512},
    {"gpt_small", "fc_dweight", kT, kN, 512, 128, 1024},
    {"gpt_medium", "qkv", kN, kT, 1024, 1152, 384},
    {"gpt_medium", "fc", kN, kT, 1024, 1536, 384},
    {"gpt_medium", "fcproj", kN, kT, 1024, 384, 1536},
    {"gpt_medium", "head", kN, kT, 1024, 256, 384},
    {"gpt_medium", "fc_dweight", kT, kN, 1536, 384, 1024},
    {"gpt_medium", "fcproj_dinp", kN, kN, 1024, 1536, 384},
};

struct Operands {
  std::vector<float> a, b, c;
  size_t lda, ldb;
  explicit Operands(const Shape& s) {
    std::mt19937 gen(1);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    a.resize(s.M * s.K);
    b.resize(s.K * s.N);
    c.resize(s.M * s.N);
    for (auto& x : a) x = dist(gen);
    for (auto& x : b) x = dist(gen);
    lda = s.ta == kT ? s.M : s.K;
    ldb = s.tb == kT ? s.K : s.N;
  }
};

// kZerodpBf16: zerodp's gemm with bf16 compute (GemmCompute::kBF16), rounding included; its
// max_abs_diff is against the fp32 product.
enum class Impl { kZerodp, kZerodpBf16, kDnnlNative, kOpenBlas };

void call(Impl impl, const Shape& s, Operands& o) {
  switch (impl) {
    case Impl::kZerodp:
      gemm(GemmCompute::kFP32, s.ta, s.tb, s.M, s.N, s.K, 1.0f, o.a, o.lda, o.b, o.ldb, 0.0f, o.c,
           s.N);
      break;
    case Impl::kZerodpBf16:
      gemm(GemmCompute::kBF16, s.ta, s.tb, s.M, s.N, s.K, 1.0f, o.a, o.lda, o.b, o.ldb, 0.0f, o.c,
           s.N);
      break;
    case Impl::kDnnlNative:
      dnnl_sgemm(s.ta == kT ? 'T' : 'N', s.tb == kT ? 'T' : 'N', static_cast<dnnl_dim_t>(s.M),
                 static_cast<dnnl_dim_t>(s.N), static_cast<dnnl_dim_t>(s.K), 1.0f, o.a.data(),
                 static_cast<dnnl_dim_t>(o.lda), o.b.data(), static_cast<dnnl_dim_t>(o.ldb), 0.0f,
                 o.c.data(), static_cast<dnnl_dim_t>(s.N));
      break;
    case Impl::kOpenBlas:
      cblas_sgemm(CblasRowMajor, s.ta == kT ? CblasTrans : CblasNoTrans,
                  s.tb == kT ? CblasTrans : CblasNoTrans, static_cast<int>(s.M),
                  static_cast<int>(s.N), static_cast<int>(s.K), 1.0f, o.a.data(),
                  static_cast<int>(o.lda), o.b.data(), static_cast<int>(o.ldb), 0.0f, o.c.data(),
                  static_cast<int>(s.N));
      break;
  }
}

// Sets the thread count the way each library takes it, on the calling thread.
void set_threads(Impl impl, int threads) {
  switch (impl) {
    case Impl::kZerodp:
    case Impl::kZerodpBf16:
      set_gemm_threads(threads);
      break;
    case Impl::kDnnlNative:
      omp_set_num_threads(threads);
      break;
    case Impl::kOpenBlas:
      openblas_set_num_threads(threads);  // process-wide
      break;
  }
}

void report(benchmark::State& state, Impl impl, const Shape& s, const Operands& o) {
  // Reference: zerodp::gemm on one thread, computed once per benchmark (outside the timing).
  Operands r(s);
  const int saved = gemm_threads();
  set_gemm_threads(1);
  call(Impl::kZerodp, s, r);
  set_gemm_threads(saved);
  const std::vector<float>& ref = r.c;
  double max_diff = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::abs(ref[i] - o.c[i])));
  }
  const bool same = std::memcmp(ref.data(), o.c.data(), ref.size() * sizeof(float)) == 0;
  const double flops =
      2.0 * static_cast<double>(s.M) * static_cast<double>(s.N) * static_cast<double>(s.K);
  state.counters["GFLOP"] = benchmark::Counter(  // shown as GFLOP=.../s
      flops * static_cast<double>(state.iterations()) * 1e-9, benchmark::Counter::kIsRate);
  state.counters["same_bits"] =
      benchmark::Counter(same ? 1.0 : 0.0, benchmark::Counter::kAvgThreads);
  state.counters["max_abs_diff"] = benchmark::Counter(max_diff, benchmark::Counter::kAvgThreads);
  if (impl == Impl::kZerodp || impl == Impl::kZerodpBf16) {
    state.counters["tiles"] = benchmark::Counter(
        static_cast<double>(gemm_tile_count(s.M, s.N, s.K)), benchmark::Counter::kAvgThreads);
  }
}

// Runs gemms with `threads` threads. Registered with Threads(2) it is two rank threads
// doing so at once, as the local backend's ranks do; GFLOP/s is then their sum.
void bm_gemm(benchmark::State& state, Impl impl, const Shape& s, int threads) {
  Operands o(s);
  set_threads(impl, threads);
  call(impl, s, o);  // warm-up: oneDNN generates its kernels on the first call of a shape
  for (auto _ : state) {
    call(impl, s, o);
    benchmark::DoNotOptimize(o.c.data());
    benchmark::ClobberMemory();
  }
  report(state, impl, s, o);
  set_threads(impl, 1);
}

const char* impl_name(Impl impl) {
  switch (impl) {
    case Impl::kZerodp:
      return "zerodp";
    case Impl::kZerodpBf16:
      return "zerodp_bf16";
    case Impl::kDnnlNative:
      return "dnnl_native";
    case Impl::kOpenBlas:
      return "openblas";
  }
  return "?";
}

std::string shape_name(const Shape& s) {
  return std::string(s.model) + "/" + s.layer + "/" + (s.ta == kT ? "T" : "N") +
         (s.tb == kT ? "T" : "N") + "/" + std::to_string(s.M) + "x" + std::to_string(s.N) + "x" +
         std::to_string(s.K);
}

void register_all() {
  for (const Shape& s : kShapes) {
    for (Impl impl : {Impl::kZerodp, Impl::kZerodpBf16, Impl::kDnnlNative, Impl::kOpenBlas}) {
      for (int threads : {1, 2}) {
        benchmark::RegisterBenchmark((std::string(impl_name(impl)) + "/" + shape_name(s) +
                                      "/threads:" + std::to_string(threads))
                                         .c_str(),
                                     bm_gemm, impl, s, threads)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  // The rank-thread scenario on two shapes; OpenBLAS is left out (its thread count is global).
  for (const Shape& s : {kShapes[1], kShapes[6]}) {
    for (Impl impl : {Impl::kZerodp, Impl::kZerodpBf16, Impl::kDnnlNative}) {
      for (int threads : {1, 2}) {
        benchmark::RegisterBenchmark((std::string("ranks/") + impl_name(impl) + "/" +
                                      shape_name(s) + "/gemm_threads:" + std::to_string(threads))
                                         .c_str(),
                                     bm_gemm, impl, s, threads)
            ->Threads(2)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

}  // namespace
}  // namespace zerodp

int main(int argc, char** argv) {
  zerodp::register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
