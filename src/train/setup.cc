#include "train/setup.h"

#include <chrono>
#include <filesystem>
#include <map>
#include <numeric>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/mutex.h"
#include "core/sha256.h"
#include "core/sysinfo.h"
#include "core/units.h"
#include "data/sampler.h"
#include "train/forecast.h"
#include "train/holdings.h"
#include "train/model_kind.h"
#include "train/plan.h"

namespace zerodp {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

Model build_model(const TrainConfig& c) {
  const ModelKind& kind = model_kind(c.model);
  if (kind.build == nullptr) {
    throw InvalidArgument(
        fmt::format("model '{}' is built by the caller: pass a ModelFactory to train()", c.model));
  }
  return kind.build(c);
}

double gemm_flops_per_core(GemmCompute compute) {
  static Mutex mu;
  static std::map<GemmCompute, double> rates GUARDED_BY(mu);
  MutexLock lock(mu);
  if (const auto it = rates.find(compute); it != rates.end()) return it->second;
  constexpr size_t n = 512;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  const int saved = gemm_threads();
  set_gemm_threads(1);
  double best = 0;
  const auto stop = Clock::now() + std::chrono::milliseconds(100);
  for (int i = 0; i < 3 || Clock::now() < stop; ++i) {
    const auto t0 = Clock::now();
    gemm(compute, Transpose::kNo, Transpose::kNo, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > 0) best = std::max(best, 2.0 * n * n * n / s);
  }
  set_gemm_threads(saved);
  rates[compute] = best;
  return best;
}

std::optional<double> gemm_flops_per_core(GemmCompute compute, std::span<const GemmShape> shapes) {
  if (shapes.empty()) return std::nullopt;
  static Mutex mu;
  static std::map<std::pair<GemmCompute, std::vector<GemmShape>>, double> rates GUARDED_BY(mu);
  const std::vector<GemmShape> distinct =
      distinct_shapes(std::vector<GemmShape>(shapes.begin(), shapes.end()));
  MutexLock lock(mu);
  const auto key = std::make_pair(compute, distinct);
  if (const auto it = rates.find(key); it != rates.end()) return it->second;
  // 0.4 s of runs: with the operands' set-up and each shape's first run, about 0.5 s in all.
  constexpr double kTotalSeconds = 0.4, kShapeSeconds = 0.05, kMaxFlops = 2e9;
  constexpr size_t kMinSide = 256;
  const auto per_shape = std::chrono::duration<double>(
      std::min(kShapeSeconds, kTotalSeconds / static_cast<double>(distinct.size())));
  const int saved = gemm_threads();
  set_gemm_threads(1);
  double best = 0;
  std::vector<float> a, b, c;
  for (GemmShape s : distinct) {
    while (s.flops() > kMaxFlops && s.M / 2 >= kMinSide) s.M /= 2;
    while (s.flops() > kMaxFlops && s.N / 2 >= kMinSide) s.N /= 2;
    while (s.flops() > kMaxFlops && s.K / 2 >= kMinSide) s.K /= 2;
    const bool ta = s.trans_a == Transpose::kYes, tb = s.trans_b == Transpose::kYes;
    a.assign(s.M * s.K, 0.5f);
    b.assign(s.K * s.N, 0.25f);
    c.assign(s.M * s.N, 0.0f);
    const auto stop = Clock::now() + std::chrono::duration_cast<Clock::duration>(per_shape);
    // Once two have run, no run starts that would end past the shape's share.
    Clock::duration last{};
    for (int i = 0; i < 2 || Clock::now() + last < stop; ++i) {
      const auto t0 = Clock::now();
      gemm(compute, s.trans_a, s.trans_b, s.M, s.N, s.K, 1.0f, a, ta ? s.M : s.K, b, tb ? s.K : s.N,
           0.0f, c, s.N);
      last = Clock::now() - t0;
      const double sec = std::chrono::duration<double>(last).count();
      if (sec > 0) best = std::max(best, s.flops() / sec);
    }
  }
  set_gemm_threads(saved);
  rates[key] = best;
  return best;
}

// Before anything is allocated: what every rank of this process will hold (the planner's
// states and transients, the same bytes the ledger will count) against --memory-per-rank
// and the machine's available memory. A run that cannot fit is refused with the stage or
// rank count that would, instead of failing halfway through allocation or swapping.
namespace {

// The offload files are reserved when the ranks start; a directory that cannot hold them is
// better refused here, with the sum, than by one rank's allocation failing.
void check_offload_dir(const std::string& dir, uint64_t bytes, int ranks) {
  std::error_code ec;
  const auto status = std::filesystem::status(dir, ec);
  if (!std::filesystem::is_directory(status)) {
    throw InvalidArgument(fmt::format(
        "--offload-dir {} {}; give a directory on a disk with room for {} of offloaded states", dir,
        std::filesystem::exists(status) ? "is not a directory" : "does not exist",
        format_bytes(static_cast<double>(bytes))));
  }
  const auto space = std::filesystem::space(dir, ec);
  if (!ec && space.available < bytes) {
    throw InvalidArgument(fmt::format(
        "--offload-dir {} has {} free, but this process's {} rank(s) keep {} of offloaded "
        "states there; free space, use another directory, a higher --stage or more ranks "
        "(zerodp estimate --offload ... says what each needs)",
        dir, format_bytes(static_cast<double>(space.available)), ranks,
        format_bytes(static_cast<double>(bytes))));
  }
}

}  // namespace

void preflight(const TrainConfig& cfg, const DataSplits& data, const ModelFactory& make_model,
               int world, int my_rank, int ranks_here) {
  // The data's own limits first: they say more precisely what is wrong with a micro-batch.
  (void)DistributedSampler(
      SamplerOptions{.dataset_size = dataset_size(data.train),
                     .world_size = world,
                     .micro_batch = cfg.micro_batch,
                     .grad_accum = cfg.grad_accum,
                     .seed = cfg.seed,
                     .keyed = std::holds_alternative<ShardDataset>(data.train)});
  const Model model = make_model ? make_model() : build_model(cfg);
  PlannedModel planned = planned_model(model);
  planned.features_per_sample = features_per_sample(data);
  check_fragments(cfg, std::accumulate(planned.units.begin(), planned.units.end(), uint64_t{0}));
  const bool local = cfg.launch.backend == Backend::kLocal;
  // A rank's memory and disk bytes with `offload`.
  const auto bytes = [&](int r, Offload offload) {
    TrainConfig with = cfg;
    with.offload = offload;
    const Holdings h = rank_holdings(with, planned, world, r);
    return std::pair(h.memory(), h.states.nvme);
  };
  uint64_t process = 0, worst = 0, disk = 0;
  int worst_rank = my_rank;
  const int first = local ? 0 : my_rank, last = local ? world : my_rank + ranks_here;
  for (int r = first; r < last; ++r) {
    const auto [need, nvme] = bytes(r, cfg.offload);
    process += need;
    disk += nvme;
    if (need > worst) {
      worst = need;
      worst_rank = r;
    }
  }
  if (cfg.memory_per_rank && worst > *cfg.memory_per_rank) {
    // What the refusal offers: the least offload that fits, priced by everything a rank
    // holds (so the planner's states-only clause is off).
    std::string offer;
    if (cfg.offload == Offload::kNone) {
      for (const Offload o : {Offload::kOptimizer, Offload::kParams}) {
        if (o == Offload::kParams && cfg.stage != 3) break;
        uint64_t need = 0;
        for (int r = first; r < last; ++r) need = std::max(need, bytes(r, o).first);
        if (need <= *cfg.memory_per_rank) {
          offer = fmt::format(
              "with --offload {} (master weights and Adam moments{} on disk, docs/offload.md) "
              "it would need {}, which fits; ",
              offload_name(o), o == Offload::kParams ? " and the parameter shards" : "",
              format_bytes(static_cast<double>(need)));
          break;
        }
      }
    }
    throw OutOfMemory(fmt::format(
        "rank {} would need {} (model states, activations and buffers), past its "
        "--memory-per-rank budget of {}; {}{}; or try --checkpoint-activations or a smaller "
        "--micro-batch",
        worst_rank, format_bytes(static_cast<double>(worst)),
        format_bytes(static_cast<double>(*cfg.memory_per_rank)), offer,
        budget_advice(cfg, planned, world, *cfg.memory_per_rank, /*name_offload=*/false)));
  }
  if (cfg.offload != Offload::kNone)
    check_offload_dir(cfg.offload_dir, disk, local ? world : ranks_here);
  const auto available = available_memory();
  if (available && process > *available) {
    throw OutOfMemory(fmt::format(
        "this process's {} rank(s) need {} together, but the machine has {} available; use a "
        "higher --stage, fewer local --ranks (or MPI across machines), --checkpoint-activations "
        "or a smaller --micro-batch",
        local ? world : ranks_here, format_bytes(static_cast<double>(process)),
        format_bytes(static_cast<double>(*available))));
  }
}

// Under MPI every process parses its own command line; ranks that disagree would hang or
// compute garbage. The first collective compares a digest of each resolved option, so a
// mismatch names the option, not just that there is one.
void check_same_options(const nlohmann::json& options, Communicator& comm) {
  CommPhaseScope phase(comm.ledger(), CommPhase::kOther);
  // Ranks whose option sets differ (another --model) must still meet in collectives of one
  // size to learn which option differs: they agree on the largest count first, so the
  // exchange grows with the options rather than failing past a fixed number of them.
  const auto slots = static_cast<size_t>(comm.max_control(static_cast<double>(options.size())));
  std::vector<std::string> keys;
  std::vector<double> mine(slots, 0.0);
  for (const auto& [key, value] : options.items()) {
    // 48 bits of each option's digest: exact in a double.
    mine[keys.size()] = static_cast<double>(
        std::stoull(sha256_hex(key + "=" + value.dump()).substr(0, 12), nullptr, 16));
    keys.push_back(key);
  }
  const std::vector<double> all = comm.gather_control(mine);
  std::vector<int> differ;
  std::string first_key;
  for (int r = 1; r < comm.size(); ++r) {
    for (size_t k = 0; k < slots; ++k) {
      if (all[static_cast<size_t>(r) * slots + k] != all[k]) {
        // A slot past this rank's options: another rank has more of them than it.
        if (first_key.empty()) first_key = k < keys.size() ? keys[k] : std::string();
        if (differ.empty() || differ.back() != r) differ.push_back(r);
      }
    }
  }
  if (differ.empty()) return;
  if (first_key.empty()) {
    throw InvalidArgument(fmt::format(
        "rank(s) {} run another configuration than rank 0: they have more options (another "
        "--model?); give every rank the same flags and --config file",
        fmt::join(differ, ", ")));
  }
  const nlohmann::json& v = options[first_key];
  throw InvalidArgument(fmt::format(
      "rank(s) {} run another configuration than rank 0: {} differs (this rank has {}); "
      "give every rank the same flags and --config file",
      fmt::join(differ, ", "), flag_of(first_key),
      v.is_number_float() ? fmt::format("{:g}", v.get<double>()) : v.dump()));
}

}  // namespace zerodp
