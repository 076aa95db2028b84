// Time per call of the layer kernels at GPT small and medium shapes (one rank's micro-batch,
// one thread), so a kernel change is measured where it runs.
//
// `GFLOP/s` counts the products a kernel needs (attention: only the causal pairs, see
// attention_flops; backward twice forward), `GB/s` the bytes an elementwise kernel must read
// and write once.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <span>
#include <vector>

#include "nn/attention.h"
#include "nn/layers.h"
#include "tensor/gemm.h"

namespace zerodp {
namespace {

std::vector<float> normal_vector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

struct Shape {
  const char* name;
  size_t B, T, C, NH;
};
constexpr Shape kSmall{"gpt_small", 16, 64, 128, 4};
constexpr Shape kMedium{"gpt_medium", 8, 128, 384, 6};

// Multiply-adds of causal attention actually needed: scores and probabilities @ v over the
// keys u <= t, 2 * (T (T + 1) / 2) * hs per (batch, head), times 2 FLOPs.
double attention_flops(const Shape& s) {
  const double hs = static_cast<double>(s.C / s.NH);
  const double pairs = static_cast<double>(s.T) * static_cast<double>(s.T + 1) / 2.0;
  return static_cast<double>(s.B * s.NH) * 2.0 * 2.0 * pairs * hs;
}

void BM_AttentionForward(benchmark::State& state, Shape s, GemmCompute compute) {
  const AttentionDims d{.B = s.B, .T = s.T, .C = s.C, .NH = s.NH};
  const auto qkv = normal_vector(s.B * s.T * 3 * s.C, 1);
  std::vector<float> out(s.B * s.T * s.C), saved(attention_saved_count(d)),
      scratch(attention_scratch_count(d));
  for (auto _ : state) {
    attention_forward(out, saved, scratch, qkv, d, compute);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(attention_flops(s) * static_cast<double>(state.iterations()) / 1e9,
                         benchmark::Counter::kIsRate);
}

void BM_AttentionBackward(benchmark::State& state, Shape s, GemmCompute compute) {
  const AttentionDims d{.B = s.B, .T = s.T, .C = s.C, .NH = s.NH};
  const auto qkv = normal_vector(s.B * s.T * 3 * s.C, 1);
  const auto dout = normal_vector(s.B * s.T * s.C, 2);
  std::vector<float> out(s.B * s.T * s.C), saved(attention_saved_count(d)),
      scratch(attention_scratch_count(d)), dqkv(qkv.size());
  attention_forward(out, saved, scratch, qkv, d, compute);
  for (auto _ : state) {
    attention_backward(dqkv, scratch, dout, qkv, saved, d, compute);
    benchmark::DoNotOptimize(dqkv.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * attention_flops(s) * static_cast<double>(state.iterations()) / 1e9,
                         benchmark::Counter::kIsRate);
}

void BM_LayerNormForward(benchmark::State& state, Shape s) {
  const size_t rows = s.B * s.T;
  const auto in = normal_vector(rows * s.C, 3), w = normal_vector(s.C, 4),
             b = normal_vector(s.C, 5);
  std::vector<float> out(rows * s.C), mean(rows), rstd(rows);
  for (auto _ : state) {
    layernorm_forward(out, mean, rstd, in, w, b, rows, s.C);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GB/s"] = benchmark::Counter(
      8.0 * static_cast<double>(rows * s.C) * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

void BM_LayerNormBackward(benchmark::State& state, Shape s) {
  const size_t rows = s.B * s.T;
  const auto in = normal_vector(rows * s.C, 3), w = normal_vector(s.C, 4),
             b = normal_vector(s.C, 5);
  const auto dout = normal_vector(rows * s.C, 6);
  std::vector<float> out(rows * s.C), mean(rows), rstd(rows), din(rows * s.C), dw(s.C), db(s.C);
  layernorm_forward(out, mean, rstd, in, w, b, rows, s.C);
  for (auto _ : state) {
    layernorm_backward(din, dw, db, dout, in, w, mean, rstd, rows, s.C);
    benchmark::DoNotOptimize(din.data());
  }
  // reads in, dout, din; writes din
  state.counters["GB/s"] = benchmark::Counter(
      16.0 * static_cast<double>(rows * s.C) * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

void BM_GeluForward(benchmark::State& state, Shape s) {
  const size_t n = s.B * s.T * 4 * s.C;
  const auto in = normal_vector(n, 7);
  std::vector<float> out(n);
  for (auto _ : state) {
    gelu_forward(out, in);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GB/s"] = benchmark::Counter(
      8.0 * static_cast<double>(n) * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

void BM_GeluBackward(benchmark::State& state, Shape s) {
  const size_t n = s.B * s.T * 4 * s.C;
  const auto in = normal_vector(n, 7), dout = normal_vector(n, 8);
  std::vector<float> din(n);
  for (auto _ : state) {
    gelu_backward(din, in, dout);
    benchmark::DoNotOptimize(din.data());
  }
  state.counters["GB/s"] = benchmark::Counter(
      16.0 * static_cast<double>(n) * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

void BM_CrossEntropy(benchmark::State& state, Shape s) {
  const size_t rows = s.B * s.T, V = 256;
  const auto logits = normal_vector(rows * V, 9);
  std::vector<int32_t> targets(rows);
  for (size_t r = 0; r < rows; ++r) targets[r] = static_cast<int32_t>((r * 37) % V);
  std::vector<float> dlogits(rows * V);
  for (auto _ : state) {
    benchmark::DoNotOptimize(cross_entropy_forward_backward(dlogits, logits, targets, rows, V));
  }
  state.counters["GB/s"] = benchmark::Counter(
      12.0 * static_cast<double>(rows * V) * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

void BM_LinearBackward(benchmark::State& state, Shape s) {
  // c_fc: (rows, C) -> (rows, 4C), the largest Linear of a block.
  const size_t rows = s.B * s.T, C = s.C, OC = 4 * s.C;
  const auto in = normal_vector(rows * C, 10), w = normal_vector(OC * C, 11),
             dout = normal_vector(rows * OC, 12);
  std::vector<float> din(rows * C), dw(OC * C), db(OC);
  for (auto _ : state) {
    linear_backward(din, dw, db, dout, in, w, rows, C, OC, GemmCompute::kFP32);
    benchmark::DoNotOptimize(dw.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      4.0 * static_cast<double>(rows * C * OC) * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

// One head's score product at the shape attention runs it (rows, keys, head size): what the
// per-call cost of gemm is at the smallest products a step makes.
void BM_HeadScores(benchmark::State& state, Shape s) {
  const size_t rows = std::min<size_t>(s.T, 64), keys = s.T, hs = s.C / s.NH, ld = 3 * s.C;
  const auto q = normal_vector(keys * ld, 13);
  std::vector<float> tile(rows * keys);
  for (auto _ : state) {
    gemm(GemmCompute::kFP32, Transpose::kNo, Transpose::kYes, rows, keys, hs, 1.0f, q, ld,
         std::span<const float>(q).subspan(s.C), ld, 0.0f, tile, keys);
    benchmark::DoNotOptimize(tile.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * static_cast<double>(rows * keys * hs) * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

void register_all() {
  for (const Shape& s : {kSmall, kMedium}) {
    const std::string n = s.name;
    benchmark::RegisterBenchmark(("attention_forward/fp32/" + n).c_str(), BM_AttentionForward, s,
                                 GemmCompute::kFP32);
    benchmark::RegisterBenchmark(("attention_backward/fp32/" + n).c_str(), BM_AttentionBackward, s,
                                 GemmCompute::kFP32);
    benchmark::RegisterBenchmark(("attention_forward/bf16/" + n).c_str(), BM_AttentionForward, s,
                                 GemmCompute::kBF16);
    benchmark::RegisterBenchmark(("attention_backward/bf16/" + n).c_str(), BM_AttentionBackward, s,
                                 GemmCompute::kBF16);
    benchmark::RegisterBenchmark(("head_scores_gemm/" + n).c_str(), BM_HeadScores, s);
    benchmark::RegisterBenchmark(("layernorm_forward/" + n).c_str(), BM_LayerNormForward, s);
    benchmark::RegisterBenchmark(("layernorm_backward/" + n).c_str(), BM_LayerNormBackward, s);
    benchmark::RegisterBenchmark(("gelu_forward/" + n).c_str(), BM_GeluForward, s);
    benchmark::RegisterBenchmark(("gelu_backward/" + n).c_str(), BM_GeluBackward, s);
    benchmark::RegisterBenchmark(("cross_entropy/" + n).c_str(), BM_CrossEntropy, s);
    benchmark::RegisterBenchmark(("linear_backward_fc/" + n).c_str(), BM_LinearBackward, s);
  }
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
