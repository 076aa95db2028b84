// zerodp estimate: per-rank model-state memory and communication per step for each stage,
// before owning the hardware, from the same planner the engine's accounting is tested
// against (train/plan.h). A GPT shape gives exact per-unit partitions; --params gives one
// flat buffer of Φ elements.
#include <cstdio>
#include <memory>
#include <sstream>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "core/units.h"
#include "models/gpt.h"
#include "train/plan.h"

namespace zerodp::cli {
namespace {

struct Flags {
  std::string params;  // e.g. 7.5e9
  int layers = 0, heads = 0, embd = 0, vocab = 256, seq_len = 0;
  std::vector<int> ranks = {1, 2, 4, 8};
  std::string stage = "all";
  std::string precision = "bf16";
  int grad_accum = 1;
  std::string accumulate;  // empty = the stage's default
  std::string memory_per_rank;
  bool json = false;
};

// Decimal units, as hardware is sold and as the ZeRO paper's tables are written.
std::string gb(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1e9) return fmt::format("{:.2f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.2f} MB", b / 1e6);
  return fmt::format("{:.2f} KB", b / 1e3);
}

int run_estimate(const Flags& f) {
  std::vector<uint64_t> units;
  std::string model;
  if (!f.params.empty()) {
    if (f.layers != 0) {
      throw InvalidArgument("give either --params or a GPT shape (--layers ...), not both");
    }
    double phi = 0;
    try {
      phi = std::stod(f.params);
    } catch (const std::exception&) {
      phi = -1;
    }
    if (!(phi >= 1) || phi > 1e15) {
      throw InvalidArgument(fmt::format(
          "--params '{}' is not a parameter count; write e.g. 7.5e9 or 124000000", f.params));
    }
    units.push_back(static_cast<uint64_t>(phi));
    model = fmt::format("{} parameters (one flat buffer)", units[0]);
  } else {
    GptConfig g{.layers = f.layers,
                .heads = f.heads,
                .embd = f.embd,
                .seq_len = f.seq_len,
                .vocab = f.vocab};
    if (g.layers == 0) {
      throw InvalidArgument(
          "give --params N or a GPT shape: --layers L --heads H --embd C --seq-len T [--vocab V]");
    }
    for (const auto& u : make_gpt(g)) units.push_back(u->numel());
    uint64_t phi = 0;
    for (uint64_t n : units) phi += n;
    model =
        fmt::format("GPT {} layers, {} heads, embd {}, seq {}, vocab {}: {} parameters in {} units",
                    g.layers, g.heads, g.embd, g.seq_len, g.vocab, phi, units.size());
  }
  const auto precision = parse_precision(f.precision);
  if (!precision) {
    throw InvalidArgument(
        fmt::format("--precision '{}' is unknown; use bf16, fp16 or fp32", f.precision));
  }
  std::vector<int> stages;
  if (f.stage == "all") {
    stages = {0, 1, 2, 3};
  } else {
    int s = -1;
    try {
      s = std::stoi(f.stage);
    } catch (const std::exception&) {
    }
    (void)Sharding::for_stage(s);
    stages = {s};
  }
  std::optional<uint64_t> budget;
  if (!f.memory_per_rank.empty()) budget = parse_bytes(f.memory_per_rank, "--memory-per-rank");
  if (f.grad_accum < 1) {
    throw InvalidArgument(fmt::format("--grad-accum {} is invalid; use 1 or more", f.grad_accum));
  }

  nlohmann::json rows = nlohmann::json::array();
  if (!f.json) {
    fmt::print("{}\n{}; model states and comm per step per rank (rank 0, the largest)\n", model,
               precision_name(*precision));
    fmt::print("{:>6} {:>5} {:>11} {:>11} {:>11} {:>11} {:>11} {:>13} {:>13} {:>5}\n", "ranks",
               "stage", "params", "grads", "master", "adam m+v", "per rank", "all ranks",
               "comm/step", "fits");
  }
  for (int n : f.ranks) {
    if (n < 1) throw InvalidArgument(fmt::format("--ranks {} is invalid; use 1 or more", n));
    std::optional<int> cheapest;
    for (int stage : stages) {
      AccumulatePolicy policy = stage >= 2 ? AccumulatePolicy::kReduce : AccumulatePolicy::kLocal;
      if (!f.accumulate.empty()) {
        const auto p = parse_accumulate(f.accumulate);
        if (!p) {
          throw InvalidArgument(
              fmt::format("--accumulate '{}' is unknown; use local or reduce", f.accumulate));
        }
        policy = *p;
      }
      const StateBytes s = max_model_state_bytes(units, n, stage, *precision);
      uint64_t all = 0;
      for (int r = 0; r < n; ++r) all += model_state_bytes(units, n, stage, *precision, r).total();
      const CommBytes c = comm_bytes_per_step(units, n, stage, *precision, f.grad_accum, policy, 0);
      const bool fits = !budget || s.total() <= *budget;
      if (fits && !cheapest) cheapest = stage;
      if (f.json) {
        rows.push_back({{"ranks", n},
                        {"stage", stage},
                        {"precision", std::string(precision_name(*precision))},
                        {"accumulate", std::string(accumulate_name(policy))},
                        {"model_state_bytes",
                         {{"params", s.params},
                          {"grads", s.grads},
                          {"master", s.master},
                          {"adam_m", s.adam_m},
                          {"adam_v", s.adam_v},
                          {"total", s.total()}}},
                        {"all_ranks_bytes", all},
                        {"comm_bytes_per_step",
                         {{"all_reduce", c.all_reduce},
                          {"reduce_scatter", c.reduce_scatter},
                          {"all_gather", c.all_gather},
                          {"total", c.total()}}},
                        {"fits", budget ? nlohmann::json(fits) : nlohmann::json()}});
      } else {
        fmt::print("{:>6} {:>5} {:>11} {:>11} {:>11} {:>11} {:>11} {:>13} {:>13} {:>5}\n", n, stage,
                   gb(s.params), gb(s.grads), gb(s.master), gb(s.adam_m + s.adam_v), gb(s.total()),
                   gb(all), gb(c.total()), budget ? (fits ? "yes" : "no") : "-");
      }
    }
    if (budget && !f.json) {
      if (cheapest) {
        fmt::print(
            "  -> {} ranks: stage {} is the least communication whose model states fit {} "
            "(activations and buffers come on top)\n",
            n, *cheapest, gb(*budget));
      } else {
        fmt::print("  -> {} ranks: no stage fits {}; {}\n", n, gb(*budget),
                   budget_advice(units, n, *precision, *budget));
      }
    }
  }
  if (f.json) fmt::print("{}\n", rows.dump());
  return 0;
}

}  // namespace

Runner add_estimate(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  app.add_option("--params", f->params, "Trainable parameters Φ, e.g. 7.5e9");
  app.add_option("--layers", f->layers, "GPT blocks (instead of --params)");
  app.add_option("--heads", f->heads, "GPT attention heads");
  app.add_option("--embd", f->embd, "GPT embedding width");
  app.add_option("--seq-len", f->seq_len, "GPT context length");
  app.add_option("--vocab", f->vocab, "GPT vocabulary")->capture_default_str();
  app.add_option("--ranks", f->ranks, "Rank counts, e.g. 1,8,64")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--stage", f->stage, "0..3 or all")->capture_default_str();
  app.add_option("--precision", f->precision, "bf16, fp16 or fp32")->capture_default_str();
  app.add_option("--grad-accum", f->grad_accum, "Micro-batches per step")->capture_default_str();
  app.add_option("--accumulate", f->accumulate, "local or reduce (default: the stage's)");
  app.add_option("--memory-per-rank", f->memory_per_rank, "Budget per rank, e.g. 80GB");
  app.add_flag("--json", f->json, "One JSON array of rows on stdout");
  return [f](Launch) { return run_estimate(*f); };
}

}  // namespace zerodp::cli
