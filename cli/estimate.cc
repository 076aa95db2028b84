// zerodp estimate: per-rank model-state memory and communication per step for each stage,
// before owning the hardware, from the same planner the engine's accounting is tested
// against (train/plan.h). A GPT shape gives exact per-unit partitions; --params gives one
// flat buffer of Φ elements.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "core/units.h"
#include "estimate_inputs.h"
#include "estimate_rows.h"
#include "models/gpt.h"
#include "models/unit.h"
#include "options.h"
#include "train/config.h"
#include "train/forecast.h"
#include "train/model_kind.h"
#include "train/plan.h"
#include "train/run_check.h"

namespace zerodp::cli {
namespace {

// estimate's own flags; the options it shares with train are the table's (train/options.h).
struct Flags {
  OptionTexts texts;
  std::string params;           // e.g. 7.5e9
  std::string flops;            // sustained FLOP/s per rank, e.g. 365e9
  std::string compute_seconds;  // or a step's measured compute, e.g. 0.219
  std::string disk_bandwidth;   // R or R/W, e.g. 2.1GB/s/1.0GB/s
  std::string ranks_per_disk;   // empty: the ranks of a node (or of the row, on one node)
  bool json = false;
};

// `transients`: need counts activations and buffers (a GPT shape), not only model states.
void print_node_modes(std::span<const ModeForecast> rows, const ModeChoice& choice, int n,
                      int per_node, std::optional<uint64_t> budget, std::optional<bool> invariant,
                      bool transients) {
  const bool timed = rows[0].seconds.has_value();
  fmt::print("  {} ranks as {} nodes x {}, stage 3, rank 0 per step:\n", n, n / per_node, per_node);
  fmt::print("    {:<34} {:>11} {:>11} {:>12}{}{}\n", "mode", "cross-node", "comm/step",
             "memory/rank", timed ? "   at links s" : "", budget ? "  fits" : "");
  for (const ModeForecast& r : rows) {
    fmt::print("    {:<34} {:>11} {:>11} {:>12}", r.mode.name, gb(r.comm.cross_total()),
               gb(r.comm.total()), r.extra > 0 ? "+" + gb(r.extra) : "-");
    if (timed) fmt::print(" {:>12.3g}", *r.seconds);
    if (budget) fmt::print(" {:>5}", r.need <= *budget ? "yes" : "no");
    fmt::print("\n");
  }
  const ModeForecast& p = rows[choice.pick];
  const ModeForecast& flat = rows[0];
  const std::string flags = p.mode.flags.empty() ? "--collectives flat, the default" : p.mode.flags;
  const auto figure = [&](const ModeForecast& r) {
    return timed ? fmt::format("{:.3g} s of comm per step", *r.seconds)
                 : fmt::format("{} across nodes per step", gb(r.comm.cross_total()));
  };
  const std::string memory =
      p.extra > 0 ? fmt::format("+{} per rank", gb(p.extra)) : std::string("no memory added");
  const std::string note = quantizes(p.mode.modes)
                               ? "; qwZ/qgZ quantize: check the loss against an unquantized run"
                               : "";
  const std::string only_flat =
      invariant.value_or(false) ? "; --invariant on keeps flat collectives" : "";
  if (!choice.fits) {
    fmt::print("  -> no mode fits {} per rank; the closest is {} ({}): it needs {}, {} over{}\n",
               gb(*budget), p.mode.name, flags, gb(p.need), gb(p.need - *budget), only_flat);
    return;
  }
  std::string line = fmt::format(
      "  -> {}: {} ({}", timed ? "at these links" : "fewest cross-node bytes", flags, figure(p));
  if (choice.pick != 0) {
    line += fmt::format(" against {} flat", timed ? fmt::format("{:.3g} s", *flat.seconds)
                                                  : gb(flat.comm.cross_total()));
  }
  line += fmt::format("; {}", memory);
  if (budget) {
    line += fmt::format(", {} of {} {}", gb(p.need), gb(*budget),
                        transients ? "in all" : "in model states and the mode's buffers");
  }
  if (choice.fastest != choice.pick) {
    const ModeForecast& q = rows[choice.fastest];
    line += fmt::format("; {} would {} but needs {}", q.mode.name,
                        timed ? fmt::format("take {:.3g} s", *q.seconds)
                              : fmt::format("move {} across nodes", gb(q.comm.cross_total())),
                        gb(q.need));
  }
  fmt::print("{}{}{})\n", line, note, only_flat);
  if (!timed) {
    fmt::print(
        "     (no link given: --link-bandwidth and --inter-node-bandwidth price the modes in "
        "seconds)\n");
  }
}

nlohmann::json node_modes_json(std::span<const ModeForecast> rows, std::optional<uint64_t> budget) {
  nlohmann::json out = nlohmann::json::array();
  for (const ModeForecast& r : rows) {
    out.push_back({{"mode", r.mode.name},
                   {"flags", r.mode.flags},
                   {"cross_node_bytes", r.comm.cross_total()},
                   {"comm_bytes", r.comm.total()},
                   {"extra_bytes", r.extra},
                   {"need_bytes", r.need},
                   {"seconds", r.seconds ? nlohmann::json(*r.seconds) : nlohmann::json()},
                   {"fits", budget ? nlohmann::json(r.need <= *budget) : nlohmann::json()},
                   {"allowed", r.allowed}});
  }
  return out;
}

// What estimate was asked, read and checked: the model, the sweep, and the run as train
// would take it (its ranks, stage and offload set per row by row_config).
struct Estimate {
  std::string model;                   // its description
  std::shared_ptr<const Model> built;  // a GPT shape's
  PlannedModel planned;
  std::vector<int> ranks, stages;
  std::optional<uint64_t> budget;
  TrainConfig asked;
  Offload offload = Offload::kNone;  // as asked: parameters go to disk at stage 3 only
  StepInputs in;
  bool timed = false;
  bool json = false;
  RowColumns columns() const {
    return {.offload = offload != Offload::kNone,
            .budget = budget.has_value(),
            .disk = in.disk.has_value()};
  }
};

void read_model(const Flags& f, Estimate& e) {
  TrainConfig& c = e.asked;
  if (!f.params.empty()) {
    for (const char* key : {"model", "size", "layers", "heads", "embd", "seq_len", "vocab",
                            "kv_heads", "ffn_hidden", "rope_theta", "norm_eps", "head"}) {
      if (f.texts.given(key) == nullptr) continue;
      throw InvalidArgument(fmt::format(
          "give either --params or a model's shape ({} and the rest), not both", flag_of(key)));
    }
    // A count of elements: whole and at least one. The cap keeps a rank's bytes far inside
    // 64 bits.
    const double phi = parse_number(f.params).value_or(-1);
    if (!(phi >= 1) || phi > 1e15 || phi != std::floor(phi)) {
      throw InvalidArgument(fmt::format(
          "--params '{}' is not a parameter count; use a whole number from 1 to 1e15, e.g. "
          "7.5e9 or 124000000",
          f.params));
    }
    e.planned.units.push_back(static_cast<uint64_t>(phi));
    e.planned.tensors = {{e.planned.units[0]}};
    e.model = fmt::format("{} parameters (one flat buffer)", e.planned.units[0]);
    return;
  }
  // A gpt is priced from the shape given (--size fills in what is left out); a llama from its
  // preset with the given fields over it, as train builds it.
  const bool gpt_shape = c.model == kGptKind && f.texts.given("size") == nullptr;
  if (c.model != kGptKind && c.model != kLlamaKind) {
    throw InvalidArgument(fmt::format(
        "--model {}: estimate prices a gpt or a llama (or --params N for any model)", c.model));
  }
  if (gpt_shape && c.layers == 0) {
    throw InvalidArgument(
        "give --params N, a preset (--model gpt|llama --size S) or a GPT shape: --layers L "
        "--heads H --embd C --seq-len T [--vocab V]");
  }
  TrainConfig shaped = c;
  if (gpt_shape) {
    if (shaped.vocab == 0) shaped.vocab = 256;
  } else {
    model_kind(shaped.model).resolve(shaped);
  }
  e.built = std::make_shared<const Model>(model_kind(shaped.model).build(shaped));
  c = shaped;  // what the rows plan with: the resolved sequence length above all
  for (const auto& u : *e.built) e.planned.units.push_back(u->numel());
  e.planned.tensors = unit_tensors(*e.built);
  e.planned.model = e.built.get();
  e.planned.layers = shaped.layers;
  e.planned.seq_len = shaped.seq_len;
  e.planned.embd = shaped.embd;
  uint64_t phi = 0;
  for (uint64_t n : e.planned.units) phi += n;
  const std::string kv =
      shaped.model == kLlamaKind
          ? fmt::format(" ({} key/value), ffn {}", shaped.kv_heads, shaped.ffn_hidden)
          : "";
  e.model = fmt::format(
      "{} {} layers, {} heads{}, embd {}, seq {}, vocab {}: {} parameters in {} "
      "units",
      shaped.model == kLlamaKind ? "Llama" : "GPT", shaped.layers, shaped.heads, kv, shaped.embd,
      shaped.seq_len, shaped.vocab, phi, e.planned.units.size());
}

// Every rank count of the sweep, with what it must agree with.
void read_ranks(const Flags& f, Estimate& e) {
  const TrainConfig& c = e.asked;
  double elements = 0;
  for (uint64_t u : e.planned.units) elements += static_cast<double>(u);
  const std::string* list = f.texts.given("ranks");
  sweep_values(option_spec("ranks"), list ? *list : "1,2,4,8", c, [&](const TrainConfig& row) {
    const int n = row.launch.ranks;
    check_world(row, n, WorldNamed::kRanksList);
    // Every byte count below is under 16 bytes per element per rank (all ranks' states) or
    // per micro-batch (a step's traffic, where a unit smaller than the world still moves
    // one element per peer); past 2^64 they would wrap silently.
    const double bound =
        16.0 * std::max<double>(n, c.grad_accum) *
        (elements + static_cast<double>(n) * static_cast<double>(e.planned.units.size()));
    if (bound >= 1.8e19) {
      throw InvalidArgument(fmt::format(
          "--ranks {} with --grad-accum {} and {} parameters puts byte counts past 2^64; use "
          "fewer ranks, micro-batches or parameters",
          n, c.grad_accum, static_cast<uint64_t>(elements)));
    }
    e.ranks.push_back(n);
  });
}

// The run as train would take it, at the stages asked (train's own check), then its rows.
void read_run(const Flags& f, Estimate& e) {
  const TrainConfig& c = e.asked;
  const std::string* stages = f.texts.given("stage");
  if (!stages || *stages == "all") {
    e.stages = {0, 1, 2, 3};
  } else {
    sweep_values(option_spec("stage"), *stages, c,
                 [&](const TrainConfig& row) { e.stages.push_back(row.stage); });
    // A stage's row is one row: in stage order, once.
    std::sort(e.stages.begin(), e.stages.end());
    e.stages.erase(std::unique(e.stages.begin(), e.stages.end()), e.stages.end());
  }
  check_run_at_stages(c, e.stages);
  e.budget = c.memory_per_rank;
  read_ranks(f, e);
}

// What prices the step: compute, the links, the disk.
void read_costs(const Flags& f, Estimate& e) {
  const TrainConfig& c = e.asked;
  e.in = parse_forecast({.flops = f.flops,
                         .compute_seconds = f.compute_seconds,
                         .disk_bandwidth = f.disk_bandwidth,
                         .ranks_per_disk = f.ranks_per_disk},
                        c.launch.comm, c.offload);
  e.timed = (e.in.flops || e.in.compute_seconds) && e.built;
  // Rows set the offload per stage (row_config): parameters go to disk at stage 3 only.
  e.offload = c.offload;
}

void print_header(const Estimate& e) {
  const TrainConfig& c = e.asked;
  const bool offload = e.offload != Offload::kNone;
  const int node_ranks = c.launch.comm.node_ranks;
  fmt::print("{}\n{}; model states and comm per step per rank (rank 0, the largest)\n", e.model,
             precision_name(c.precision));
  if (c.grad_accum > 1 && c.invariant.value_or(true)) {
    fmt::print(
        "--grad-accum {}: the canonical gradient order (the same bits on any rank count) {}: "
        "an fp32 accumulator, grads at 4 bytes per owned element at stages 2-3 "
        "(docs/determinism.md)\n",
        c.grad_accum, c.invariant ? "at every stage" : "where the policy is reduce");
  }
  if (e.built) {
    fmt::print(
        "activations for micro-batch {} x {} tokens{}; peak/rank = states + activations "
        "+ workspace + buffers\n",
        c.micro_batch, c.seq_len, c.checkpoint_activations ? ", activation checkpointing" : "");
  }
  if (offload) {
    fmt::print(
        "--offload optimizer: master weights{} and Adam moments in a file per rank (nvme, "
        "not in per rank), streamed through the update in pieces (peak/rank counts the "
        "staging)\n",
        c.precision == Precision::kFP32 ? " (none at fp32: the params are the master)" : "");
    if (e.offload == Offload::kParams) {
      fmt::print(
          "--offload optimizer,params: at stage 3 the parameter shards too, read before "
          "every gather (stages 0-2 offload the optimizer only: every rank computes on "
          "its full copy)\n");
    }
  }
  const std::optional<DiskBandwidth>& disk = e.in.disk;
  if (e.timed) {
    fmt::print(
        "step s = max(compute, comm issued during compute) + comm at the boundary "
        "(--accumulate local reductions, stages 1-2's parameter gather){}\n",
        disk ? " + io s" : "");
  }
  if (disk) {
    fmt::print(
        "io s = nvme / {}/s read + nvme / {}/s write, x the ranks sharing the disk ({}), "
        "every step{}{}\n",
        gb(static_cast<uint64_t>(disk->read)), gb(static_cast<uint64_t>(disk->write)),
        e.in.ranks_per_disk ? fmt::format("--ranks-per-disk {}", *e.in.ranks_per_disk)
        : node_ranks > 0    ? fmt::format("a node's {}", node_ranks)
                            : std::string("all the row's ranks: one machine"),
        e.offload == Offload::kParams
            ? "; offloaded parameters are read for every gather (2 per micro-batch, 1 with "
              "hpZ) and written once, not read, by the update"
            : "",
        e.timed ? "; bound: the largest of compute s, comm s and io s" : "");
  }
}

// DiLoCo's outer state and exchanges at `n` ranks (the same at every stage: the islands'
// own ranges do not depend on it), and the advice on H.
void print_islands(const Estimate& e, int n, const Forecast::Outer& o) {
  const TrainConfig& c = e.asked;
  if (c.islands_in_turn) {
    fmt::print(
        "  -> {} ranks holding {} islands in turn (the states {} times in the rows, the step {} "
        "times as long): outer state {} per rank (in the rows' needs); the islands meet in "
        "memory, no exchange crosses ranks\n",
        n, c.islands, c.islands, c.islands, gb(o.state));
    return;
  }
  const std::string islands =
      fmt::format("{} ranks as {} islands of {}", n, c.islands, n / c.islands);
  fmt::print(
      "  -> {}: outer state {} per rank (in the rows' needs); a round "
      "of outer steps every --outer-every {} moves {} per rank ({} across nodes), {} per step; "
      "the largest exchange (--fragments {}) {}\n",
      islands, gb(o.state), c.outer_every, gb(o.exchange_round.total()),
      gb(o.exchange_round.cross_total()),
      gb(o.exchange_round.total() / static_cast<uint64_t>(c.outer_every)), c.fragments,
      gb(o.burst.total()));
  if (o.round_seconds) {
    fmt::print("     a round takes {:.3g} s at the link{}\n", *o.round_seconds,
               o.advised_every ? fmt::format("; --outer-every {} or more keeps it within a tenth "
                                             "of the inner steps' time",
                                             *o.advised_every)
                               : "");
  }
}

// Why no stage fits at `n` ranks, and what would: other stages' states, activation
// checkpointing or a smaller micro-batch at stage 3, and the optimizer's states on disk.
std::string no_fit_advice(const Estimate& e, int n) {
  const TrainConfig& asked = e.asked;
  const uint64_t budget = *e.budget;
  const bool offload = e.offload != Offload::kNone;
  // Whether stage 3 reducing every micro-batch (as the advice prices it) keeps an fp32
  // accumulator: the engine's rule, asked of that run.
  TrainConfig reduce3 = row_config(asked, n, 3, e.offload);
  reduce3.accumulate = AccumulatePolicy::kReduce;
  reduce3.shard_within_node = false;
  const bool accumulator3 = fp32_accumulator(reduce3);
  // The clause below prices offload by all a rank holds, not by its states alone.
  std::string why = budget_advice(asked, e.planned, n, budget, /*name_offload=*/false);
  if (e.built) {
    // What stage 3 would need with less of the activations kept: reduced every micro-batch,
    // its own --hpz kept, no qwZ staging, the states sharded over the world.
    const auto at_stage3 = [&](bool ckpt, int b) {
      TrainConfig c = row_config(asked, n, 3, e.offload);
      c.accumulate = AccumulatePolicy::kReduce;
      c.invariant = accumulator3;
      c.qwz = false;
      c.shard_within_node = false;
      c.checkpoint_activations = ckpt;
      c.micro_batch = b;
      return forecast(c, e.planned).need;
    };
    const uint64_t ck = at_stage3(true, asked.micro_batch);
    const uint64_t small = at_stage3(asked.checkpoint_activations, 1);
    why = fmt::format(
        "{}; at stage 3 with --checkpoint-activations a rank needs {} ({}), with "
        "--micro-batch 1 {} ({})",
        why, gb(ck), ck <= budget ? "fits" : "does not fit", gb(small),
        small <= budget ? "fits" : "does not fit");
  }
  if (offload) return why;
  // The least communication that fits once the optimizer's states are on disk, at the run's
  // other flags; else the least memory: stages 0-3 with the optimizer offloaded, then stage 3
  // with its parameters too.
  struct Offer {
    int stage;
    Offload offload;
  };
  const Offer offers[] = {{0, Offload::kOptimizer},
                          {1, Offload::kOptimizer},
                          {2, Offload::kOptimizer},
                          {3, Offload::kOptimizer},
                          {3, Offload::kParams}};
  std::optional<size_t> fit;
  size_t least = 0;
  std::vector<Forecast> with;
  for (const Offer& o : offers) {
    with.push_back(forecast(row_config(asked, n, o.stage, o.offload), e.planned));
    if (!fit && with.back().need <= budget) fit = with.size() - 1;
    if (with.back().need < with[least].need) least = with.size() - 1;
  }
  const std::string what = e.built ? "states, activations and buffers" : "model states";
  if (fit) {
    return why + fmt::format(
                     "; with --offload {}{} stage {} fits: {} per rank in memory ({}), {} per "
                     "rank on disk (--disk-bandwidth prices its reads and writes)",
                     offload_name(offers[*fit].offload), asked.qwz ? " in place of --qwz" : "",
                     offers[*fit].stage, gb(with[*fit].need), what, gb(with[*fit].states.nvme));
  }
  return why + fmt::format(
                   "; --offload{} does not fit either: the least is stage {}'s {} per rank in "
                   "memory ({}) with --offload {}",
                   asked.qwz ? " in place of --qwz" : "", offers[least].stage, gb(with[least].need),
                   what, offload_name(offers[least].offload));
}

int run_estimate(const Flags& f) {
  Estimate e;
  // estimate's defaults where train derives them: one sequence, one micro-batch per step.
  e.asked.micro_batch = 1;
  e.asked.grad_accum = 1;
  e.asked.accumulate_default = true;
  e.asked.given = read_table_options(f.texts, e.asked, kEstimateCommand);
  read_model(f, e);
  read_run(f, e);
  read_costs(f, e);
  e.json = f.json;
  const int node_ranks = e.asked.launch.comm.node_ranks;
  nlohmann::json rows = nlohmann::json::array();
  if (!e.json) print_header(e);
  for (int n : e.ranks) {
    std::optional<int> cheapest;
    std::optional<size_t> stage3_row;  // in `rows`
    std::optional<Forecast::Outer> outer;
    for (int stage : e.stages) {
      const TrainConfig c = row_config(e.asked, n, stage, e.offload);
      const Forecast fc = forecast(c, e.planned, e.in);
      outer = fc.outer;
      const bool fits = !e.budget || fc.need <= *e.budget;
      if (fits && !cheapest) cheapest = stage;
      if (e.json) {
        if (stage == 3) stage3_row = rows.size();
        rows.push_back(row_json(e.columns(), c, fc, fits));
      } else {
        // The columns are the same for every row: named above the first.
        if (n == e.ranks.front() && stage == e.stages.front()) {
          fmt::print("{}\n", table_line(e.columns(), c, fc, fits, true));
        }
        fmt::print("{}\n", table_line(e.columns(), c, fc, fits, false));
      }
    }
    if (outer && !e.json) print_islands(e, n, *outer);
    if (e.asked.checkpoint_async && !e.json) {
      fmt::print(
          "  -> --checkpoint-async: each rank stages its checkpoint shard, {} on rank 0 (in "
          "the rows' needs)\n",
          gb(checkpoint_staging_bytes(e.planned.units,
                                      row_config(e.asked, n, e.stages.front(), e.offload), n, 0,
                                      &e.planned.tensors)));
    }
    if (e.budget && !e.json) {
      if (cheapest) {
        fmt::print("  -> {} ranks: stage {} is the least communication whose {} fit {}\n", n,
                   *cheapest,
                   e.built ? "states, activations and buffers"
                           : "model states (activations "
                             "and buffers come on top)",
                   gb(*e.budget));
      } else {
        fmt::print("  -> {} ranks: no stage fits {}; {}\n", n, gb(*e.budget), no_fit_advice(e, n));
      }
    }
    // The node modes are ways to run one synchronous world; islands are another.
    if (e.asked.islands > 1 || node_ranks == 0 || node_ranks >= n ||
        std::find(e.stages.begin(), e.stages.end(), 3) == e.stages.end()) {
      continue;
    }
    const std::vector<ModeForecast> modes =
        node_mode_forecasts(row_config(e.asked, n, 3, e.offload), e.planned, e.in);
    const ModeChoice choice = choose_mode(modes, e.budget);
    if (!e.json) {
      print_node_modes(modes, choice, n, node_ranks, e.budget, e.asked.invariant,
                       e.built != nullptr);
    } else if (stage3_row) {
      const ModeForecast& p = modes[choice.pick];
      nlohmann::json& row = rows[*stage3_row];
      row["node_modes"] = node_modes_json(modes, e.budget);
      row["node_mode_choice"] = {
          {"mode", p.mode.name},
          {"flags", p.mode.flags},
          {"by", choice.by_seconds ? "seconds" : "cross_node_bytes"},
          {"fits", e.budget ? nlohmann::json(choice.fits) : nlohmann::json()},
          {"need_bytes", p.need},
          {"over_bytes", choice.fits ? 0 : p.need - *e.budget},
          {"quantized", quantizes(p.mode.modes)}};
    }
  }
  if (e.json) fmt::print("{}\n", rows.dump());
  return 0;
}

}  // namespace

Runner add_estimate(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  app.add_option("--params", f->params,
                 "Trainable parameters Φ, e.g. 7.5e9 (or a preset, or a GPT shape)");
  add_table_options(app, kEstimateCommand, f->texts, /*sections=*/false);
  app.get_option("--ranks")->default_str("1,2,4,8");
  app.get_option("--stage")->default_str("all");
  app.add_option("--flops", f->flops,
                 "Sustained FLOP/s per rank for the step-time estimate, e.g. 365e9");
  app.add_option("--compute-seconds", f->compute_seconds,
                 "Or a step's compute per rank as measured, e.g. 0.219 (a run's step time "
                 "without a simulated link)");
  app.add_option("--disk-bandwidth", f->disk_bandwidth,
                 "With --offload optimizer: the disk's bytes per second, one figure for reads and "
                 "writes or READ/WRITE, e.g. 2GB/s, 2.1GB/s/1.0GB/s or 2138e6/1031e6 (zerodp "
                 "bench-io DIR measures them); adds io s = nvme/READ + nvme/WRITE per step, "
                 "times the ranks sharing the disk, to the step time");
  app.add_option("--ranks-per-disk", f->ranks_per_disk,
                 "With --disk-bandwidth: ranks whose files share one disk's bandwidth, e.g. 8 "
                 "(default: --node-ranks, else every rank of the row: one machine)");
  app.add_flag("--json", f->json, "One JSON array of rows on stdout");
  return [f](Launch) { return run_estimate(*f); };
}

}  // namespace zerodp::cli
