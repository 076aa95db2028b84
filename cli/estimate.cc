// zerodp estimate: per-rank model-state memory and communication per step for each stage,
// before owning the hardware, from the same planner the engine's accounting is tested
// against (train/plan.h). A GPT shape gives exact per-unit partitions; --params gives one
// flat buffer of Φ elements.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "comm/link_model.h"
#include "comm/quantize.h"
#include "commands.h"
#include "core/error.h"
#include "core/units.h"
#include "estimate_inputs.h"
#include "models/gpt.h"
#include "models/unit.h"
#include "train/config.h"
#include "train/plan.h"
#include "train/stage_plan.h"

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
  std::string invariant = "auto";
  int node_ranks = 0;  // 0: one node
  std::string collectives = "flat";
  bool hpz = false;
  bool shard_within_node = false;
  bool qwz = false;
  std::string qgz = "off";
  size_t qgz_block = 256;
  int qwz_block = 4096;
  std::string memory_per_rank;
  bool json = false;
  // Activations and step time (GPT shapes only).
  int micro_batch = 1;
  int prefetch = 1;
  bool checkpoint_activations = false;
  std::string flops;            // sustained FLOP/s per rank, e.g. 365e9
  std::string compute_seconds;  // or a step's measured compute, e.g. 0.219
  std::string link_bandwidth;   // e.g. 10GB/s
  std::string link_latency;     // e.g. 20us
  std::string inter_node_bandwidth;
  std::string inter_node_latency;
  // --offload optimizer[,params]: the optimizer's states (and stage 3's parameter shards) in
  // a file per rank, priced at the disk.
  std::string offload = "none";
  std::string disk_bandwidth;    // R or R/W, e.g. 2.1GB/s/1.0GB/s
  bool offload_overlap = false;  // train's --offload-overlap
  std::string ranks_per_disk;    // empty: the ranks of a node (or of the row, on one node)
};

// Per-rank step time from the cost model: compute = model FLOPs / --flops; comm = bytes /
// --link-bandwidth + ring steps x --link-latency, split by when the engine issues it. Over
// several nodes (--node-ranks) the simulated link's rules apply: a flat collective runs at
// the link between nodes; a two-level one pays the link inside a node for its intra-node
// bytes over T - 1 steps and the link between nodes for its cross-node bytes over P - 1.
// Overlappable: reductions issued during backward (--accumulate reduce) and stage 3's
// prefetched gathers; serial: reductions at the step's boundary (--accumulate local) and
// stages 1-2's gather of the updated parameters. The step is max(compute, overlappable) +
// serial: overlap assumed perfect where the engine allows it, none elsewhere.
struct StepTime {
  double compute = 0, comm_overlap = 0, comm_serial = 0;
  double comm() const { return comm_overlap + comm_serial; }
  double serial() const { return compute + comm(); }
  double overlapped() const { return std::max(compute, comm_overlap) + comm_serial; }
};

// The offloaded step: the in-memory step plus the update's I/O, except that at stages 0
// and 3 with train's --offload-overlap the next step's forward (a third of the compute:
// 2 of the 6 FLOPs per parameter and token) runs beside the update's I/O.
double offload_step(const StepTime& t, double io, int stage, bool overlap) {
  const double hidden = overlap && (stage == 0 || stage == 3) ? std::min(io, t.compute / 3) : 0;
  return t.overlapped() + io - hidden;
}

// What a step with offload waits on most: compute, the links, or the disk.
std::string bound(const StepTime& t, double io) {
  if (io > t.compute && io > t.comm()) return "io";
  return t.comm() > t.compute ? "comm" : "compute";
}

// Decimal units, as hardware is sold and as the ZeRO paper's tables are written.
std::string gb(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1e9) return fmt::format("{:.2f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.2f} MB", b / 1e6);
  return fmt::format("{:.2f} KB", b / 1e3);
}

// A way to run stage 3 over nodes: ZeRO++'s switches, as train takes them.
struct NodeMode {
  std::string name;
  std::string flags;  // what a flat run's command line gains; empty for flat
  int switches = 0;   // how many flags: ties go to the fewer
  CommModes modes;
};

// Every combination of hpZ, qwZ and qgZ int4 on two-level collectives, fewer switches
// first, so a budget too small for one mode's memory still finds the best of the rest; and
// qgZ int8, never fewer bytes than int4 at the same memory, for its smaller error.
std::vector<NodeMode> node_modes(int per_node, size_t qwz_block, size_t qgz_block) {
  std::vector<NodeMode> out;
  const auto add = [&](bool two_level, bool hpz, bool qwz, int qgz_bits) {
    NodeMode m{.name = two_level ? "two-level" : "flat",
               .flags = two_level ? "--collectives two-level" : "",
               .switches = two_level ? 1 : 0,
               .modes = {.node_ranks = per_node,
                         .two_level = two_level,
                         .hpz = hpz,
                         .qwz_block = qwz ? qwz_block : 0,
                         .qgz_bits = qgz_bits,
                         .qgz_block = qgz_block}};
    const auto with = [&](bool on, const char* name, const char* flag) {
      if (!on) return;
      m.name += fmt::format(" + {}", name);
      m.flags += fmt::format(" {}", flag);
      ++m.switches;
    };
    with(hpz, "hpZ", "--hpz");
    with(qwz, "qwZ", "--qwz");
    with(qgz_bits == 8, "qgZ int8", "--qgz int8");
    with(qgz_bits == 4, "qgZ int4", "--qgz int4");
    out.push_back(std::move(m));
  };
  add(false, false, false, 0);
  add(true, false, false, 0);
  add(true, false, false, 8);
  add(true, false, false, 4);
  add(true, true, false, 0);
  add(true, false, true, 0);
  add(true, true, true, 0);
  add(true, true, false, 4);
  add(true, false, true, 4);
  add(true, true, true, 8);
  add(true, true, true, 4);
  // HSDP: not a switch on stage 3's exchange but another sharding, which trades memory for
  // cross-node bytes.
  out.push_back(NodeMode{.name = "HSDP (shard within node)",
                         .flags = "--shard-within-node",
                         .switches = 1,
                         .modes = {.node_ranks = per_node, .shard_within_node = true}});
  return out;
}

bool quantizes(const CommModes& m) { return m.qwz_block > 0 || m.qgz_bits != 0; }

// One mode's figures for rank 0 per step.
struct ModeRow {
  NodeMode mode;
  CommBytes comm;
  uint64_t extra = 0;             // hpZ's node copy + qwZ's staging
  uint64_t need = 0;              // the stage-3 row's states (+ transients for a GPT shape) + extra
  std::optional<double> seconds;  // at the links, when a bandwidth is given
  bool allowed = true;            // false where --invariant on refuses it
};

// The pick: the least seconds at the links (or, with none given, the fewest cross-node
// bytes) among the modes that fit the budget, ties to the fewer flags. `fits` false: none
// fits and `pick` is the one whose need is least. `fastest`: the pick with no budget.
struct ModeChoice {
  size_t pick = 0;
  bool fits = true;
  size_t fastest = 0;
  bool by_seconds = false;
};

ModeChoice choose_mode(std::span<const ModeRow> rows, std::optional<uint64_t> budget) {
  ModeChoice c;
  c.by_seconds = !rows.empty() && rows[0].seconds.has_value();
  // Seconds are sums of quotients: two modes moving the same bytes can differ in the last
  // bits, which must not outweigh a flag fewer.
  const auto better = [&](const ModeRow& a, const ModeRow& b) {
    if (c.by_seconds) {
      const double x = *a.seconds, y = *b.seconds;
      const double tol = 1e-9 * std::max(std::abs(x), std::abs(y));
      if (x < y - tol || y < x - tol) return x < y;
    } else if (a.comm.cross_total() != b.comm.cross_total()) {
      return a.comm.cross_total() < b.comm.cross_total();
    }
    return a.mode.switches < b.mode.switches;
  };
  std::optional<size_t> pick, fastest, closest;
  for (size_t i = 0; i < rows.size(); ++i) {
    const ModeRow& r = rows[i];
    if (!r.allowed) continue;
    if (!fastest || better(r, rows[*fastest])) fastest = i;
    if ((!budget || r.need <= *budget) && (!pick || better(r, rows[*pick]))) pick = i;
    if (!closest || r.need < rows[*closest].need ||
        (r.need == rows[*closest].need && better(r, rows[*closest]))) {
      closest = i;
    }
  }
  c.fastest = fastest.value_or(0);
  c.fits = pick.has_value();
  c.pick = pick.value_or(closest.value_or(0));
  return c;
}

// Stage 3 over nodes of T ranks: what each mode moves across nodes per step for rank 0,
// what it adds to a rank's memory and (given the links' bandwidths) how long its bytes take
// at them. `base_need(canonical, shards)`: the stage-3 row's need without hpZ or qwZ, with or
// without the canonical order's fp32 accumulator (flat collectives keep the order under
// --invariant auto; two-level and qgZ drop it), states sharded over `shards` ranks (the
// world, or a node's under HSDP). Under --offload optimizer qwZ is not allowed: it quantizes
// from the fp32 master, which is on disk.
std::vector<ModeRow> node_mode_rows(std::span<const uint64_t> units, int n, int per_node,
                                    Precision precision, int grad_accum, AccumulatePolicy policy,
                                    std::optional<bool> invariant, bool offload, int prefetch,
                                    size_t qwz_block, size_t qgz_block,
                                    std::optional<double> bandwidth,
                                    std::optional<double> inter_bandwidth,
                                    const std::function<uint64_t(bool, int)>& base_need) {
  const int w = precision == Precision::kFP32 ? 4 : 2;
  std::vector<ModeRow> rows;
  for (NodeMode& m : node_modes(per_node, qwz_block, qgz_block)) {
    ModeRow r;
    const bool hsdp = m.modes.shard_within_node;
    const bool reorders = m.modes.two_level || m.modes.qgz_bits != 0 || hsdp;
    r.allowed = !(invariant.value_or(false) && reorders) && !(offload && m.modes.qwz_block > 0);
    const bool canonical =
        invariant.value_or(policy == AccumulatePolicy::kReduce && !reorders) && !reorders;
    r.comm = comm_bytes_per_step(units, n, 3, precision, grad_accum, policy, canonical, 0, m.modes);
    // What the mode adds: hpZ's node copy, qwZ's staging of every rank's payload per slot.
    uint64_t staging = 0;
    for (uint64_t u : units) {
      if (m.modes.hpz) r.extra += Partition(u, per_node).count(0) * static_cast<uint64_t>(w);
      if (m.modes.qwz_block > 0) {
        const Partition part(u, n);
        uint64_t bytes = 0;
        for (int k = 0; k < n; ++k) {
          bytes += quantized_bytes(
              part.count(k), BlockQuant{.bits = QuantBits::kInt8, .block = m.modes.qwz_block});
        }
        staging = std::max(staging, bytes);
      }
    }
    r.extra += static_cast<uint64_t>(1 + prefetch) * staging;
    // HSDP's states cost 1/T instead of 1/N per rank.
    if (hsdp) r.extra += base_need(false, per_node) - base_need(false, n);
    r.need = base_need(canonical, n) + r.extra;
    if (bandwidth || inter_bandwidth) {
      const double cross = static_cast<double>(r.comm.cross_total());
      const double intra = static_cast<double>(r.comm.total()) - cross;
      // The communicator's own model of the link (comm/link_model.h), bandwidth only here.
      const LinkModel link{.bandwidth = bandwidth.value_or(0),
                           .inter_bandwidth = inter_bandwidth.value_or(0),
                           .nic_ranks = static_cast<double>(per_node)};
      r.seconds = m.modes.two_level || hsdp
                      ? link.two_level_seconds(intra, 0, cross, 0)
                      : link.flat_seconds(static_cast<double>(r.comm.total()), cross, 0, true);
    }
    r.mode = std::move(m);
    rows.push_back(std::move(r));
  }
  return rows;
}

// `transients`: need counts activations and buffers (a GPT shape), not only model states.
void print_node_modes(std::span<const ModeRow> rows, const ModeChoice& choice, int n, int per_node,
                      std::optional<uint64_t> budget, std::optional<bool> invariant,
                      bool transients) {
  const bool timed = rows[0].seconds.has_value();
  fmt::print("  {} ranks as {} nodes x {}, stage 3, rank 0 per step:\n", n, n / per_node, per_node);
  fmt::print("    {:<34} {:>11} {:>11} {:>12}{}{}\n", "mode", "cross-node", "comm/step",
             "memory/rank", timed ? "   at links s" : "", budget ? "  fits" : "");
  for (const ModeRow& r : rows) {
    fmt::print("    {:<34} {:>11} {:>11} {:>12}", r.mode.name, gb(r.comm.cross_total()),
               gb(r.comm.total()), r.extra > 0 ? "+" + gb(r.extra) : "-");
    if (timed) fmt::print(" {:>12.3g}", *r.seconds);
    if (budget) fmt::print(" {:>5}", r.need <= *budget ? "yes" : "no");
    fmt::print("\n");
  }
  const ModeRow& p = rows[choice.pick];
  const ModeRow& flat = rows[0];
  const std::string flags = p.mode.flags.empty() ? "--collectives flat, the default" : p.mode.flags;
  const auto figure = [&](const ModeRow& r) {
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
    const ModeRow& q = rows[choice.fastest];
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

nlohmann::json node_modes_json(std::span<const ModeRow> rows, std::optional<uint64_t> budget) {
  nlohmann::json out = nlohmann::json::array();
  for (const ModeRow& r : rows) {
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

// The no-fit sentence under --offload optimizer: what memory keeps of each stage's states
// (the planner's budget_advice counts the states offload moves to disk), and the fewest ranks
// at which stage 3's fit.
// What a row at `stage` offloads when --offload asks for `asked`: parameters only at stage 3.
Offload stage_offload(Offload asked, int stage) {
  return asked == Offload::kParams && stage != 3 ? Offload::kOptimizer : asked;
}

std::string offload_advice(std::span<const uint64_t> units, int n, Precision precision,
                           uint64_t budget, bool accumulator, bool transients, Offload offload) {
  const auto states = [&](int stage, int ranks) {
    return max_model_state_bytes(units, ranks, stage, precision, accumulator,
                                 stage_offload(offload, stage))
        .total();
  };
  std::string s = fmt::format(
      "model states in memory per rank with --offload {} at {} ranks:", offload_name(offload), n);
  for (int stage = 0; stage <= 3; ++stage) {
    s += fmt::format(" stage {} {}{}{}", stage, gb(states(stage, n)),
                     states(stage, n) <= budget ? " (fits)" : "", stage < 3 ? "," : "");
  }
  if (states(3, n) <= budget) {
    return s + (transients ? "; it is the activations and buffers that do not fit"
                           : "; use a stage marked (fits)");
  }
  // Stage 3's states shrink as 1/N: double, then bisect to the fewest ranks.
  int hi = n;
  while (hi < (1 << 20) && states(3, hi) > budget) hi *= 2;
  if (states(3, hi) > budget) return s + "; no rank count makes them fit";
  int lo = std::max(n, hi / 2);
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (states(3, mid) <= budget) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return s + fmt::format("; stage 3 needs at least {} ranks for them to fit{}", hi,
                         transients ? " (activations and buffers come on top)" : "");
}

int run_estimate(const Flags& f) {
  std::vector<uint64_t> units;
  std::string model;
  std::optional<GptConfig> gpt;
  if (!f.params.empty()) {
    if (f.layers != 0 || f.heads != 0 || f.embd != 0 || f.seq_len != 0) {
      throw InvalidArgument(
          "give either --params or a GPT shape (--layers --heads --embd --seq-len), not both");
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
    gpt = g;
    uint64_t phi = 0;
    for (uint64_t n : units) phi += n;
    model =
        fmt::format("GPT {} layers, {} heads, embd {}, seq {}, vocab {}: {} parameters in {} units",
                    g.layers, g.heads, g.embd, g.seq_len, g.vocab, phi, units.size());
  }
  const Precision precision = parse_precision_flag(f.precision);
  std::vector<int> stages;
  if (f.stage == "all") {
    stages = {0, 1, 2, 3};
  } else if (f.stage.size() == 1 && f.stage[0] >= '0' && f.stage[0] <= '3') {
    stages = {f.stage[0] - '0'};
  } else {
    throw InvalidArgument(
        fmt::format("--stage '{}' is not a ZeRO stage; use 0, 1, 2, 3 or all", f.stage));
  }
  std::optional<uint64_t> budget;
  if (!f.memory_per_rank.empty()) {
    budget = parse_bytes(f.memory_per_rank, "--memory-per-rank");
    if (*budget == 0) {
      throw InvalidArgument(fmt::format(
          "--memory-per-rank {} is invalid; use a positive size, e.g. 80GB", f.memory_per_rank));
    }
  }
  if (f.grad_accum < 1) {
    throw InvalidArgument(fmt::format("--grad-accum {} is invalid; use 1 or more", f.grad_accum));
  }
  double elements = 0;
  for (uint64_t u : units) elements += static_cast<double>(u);
  for (int n : f.ranks) {
    if (n < 1) throw InvalidArgument(fmt::format("--ranks {} is invalid; use 1 or more", n));
    if (f.node_ranks < 0 || (f.node_ranks > 0 && n % f.node_ranks != 0)) {
      throw InvalidArgument(fmt::format(
          "--node-ranks {} does not divide --ranks {}: a world is whole nodes; use rank counts "
          "that are multiples of it",
          f.node_ranks, n));
    }
    // Every byte count below is under 16 bytes per element per rank (all ranks' states) or
    // per micro-batch (a step's traffic, where a unit smaller than the world still moves
    // one element per peer); past 2^64 they would wrap silently.
    const double bound = 16.0 * std::max<double>(n, f.grad_accum) *
                         (elements + static_cast<double>(n) * static_cast<double>(units.size()));
    if (bound >= 1.8e19) {
      throw InvalidArgument(fmt::format(
          "--ranks {} with --grad-accum {} and {} parameters puts byte counts past 2^64; use "
          "fewer ranks, micro-batches or parameters",
          n, f.grad_accum, static_cast<uint64_t>(elements)));
    }
  }
  std::optional<AccumulatePolicy> accumulate;
  if (!f.accumulate.empty()) {
    accumulate = parse_accumulate_flag(f.accumulate);
  }
  const std::optional<bool> invariant = parse_invariant_flag(f.invariant);
  if (accumulate) check_invariant_policy(invariant, *accumulate);
  const bool two_level = parse_collectives_flag(f.collectives);
  const int qgz_bits = parse_qgz_flag(f.qgz);
  check_invariant_collectives(invariant, CommOptions{.two_level = two_level, .qgz_bits = qgz_bits});
  check_node_modes(f.node_ranks, two_level, f.hpz, qgz_bits, f.qgz_block, f.qwz_block);
  if (f.shard_within_node) {
    // Rows of stage 0 stay plain ZeRO; the check wants a stage that shards, if any is asked.
    check_shard_within_node(*std::max_element(stages.begin(), stages.end()), f.node_ranks,
                            invariant, two_level, f.hpz, f.qwz, qgz_bits);
  }

  if (f.micro_batch < 1) {
    throw InvalidArgument(
        fmt::format("--micro-batch {} is invalid; use 1 or more sequences", f.micro_batch));
  }
  // The bound train enforces, so an estimate never describes a run train would refuse.
  if (f.prefetch < 0 || f.prefetch > 8) {
    throw InvalidArgument(fmt::format("--prefetch {} is invalid; use 0..8", f.prefetch));
  }
  const auto [flops, compute_seconds, bandwidth, latency, inter_bandwidth, inter_latency] =
      parse_forecast({.flops = f.flops,
                      .compute_seconds = f.compute_seconds,
                      .link_bandwidth = f.link_bandwidth,
                      .link_latency = f.link_latency,
                      .inter_node_bandwidth = f.inter_node_bandwidth,
                      .inter_node_latency = f.inter_node_latency,
                      .node_ranks = f.node_ranks});
  const bool timed = (flops || compute_seconds) && gpt;
  const Offload offload_flag = parse_offload(f.offload);
  const bool offload = offload_flag != Offload::kNone;
  check_offload_modes(offload_flag, f.qwz, 3, f.offload_overlap);
  std::optional<DiskBandwidth> disk;
  if (!f.disk_bandwidth.empty()) {
    if (!offload) {
      throw InvalidArgument(fmt::format(
          "--disk-bandwidth {} prices the offload file's reads and writes; give --offload "
          "optimizer with it (or leave it out)",
          f.disk_bandwidth));
    }
    disk = parse_disk_bandwidth(f.disk_bandwidth);
  }
  std::optional<int> ranks_per_disk;
  if (!f.ranks_per_disk.empty()) {
    if (!disk) {
      throw InvalidArgument(fmt::format(
          "--ranks-per-disk {} divides a disk's bandwidth among ranks; give --offload optimizer "
          "and --disk-bandwidth with it",
          f.ranks_per_disk));
    }
    const double k = parse_number(f.ranks_per_disk).value_or(0);
    if (!(k >= 1) || k > 1e6 || k != std::floor(k)) {
      throw InvalidArgument(
          fmt::format("--ranks-per-disk '{}' is not a rank count; use a whole number, 1 or more",
                      f.ranks_per_disk));
    }
    ranks_per_disk = static_cast<int>(k);
  }
  // Ranks that stream their files from one disk at once share its bandwidth: by default every
  // rank of a node (a machine), and never more than the row has.
  const auto disk_sharers = [&](int n) {
    const int k = ranks_per_disk.value_or(f.node_ranks > 0 ? f.node_ranks : n);
    return std::min(k, n);
  };
  // The update reads and writes every byte of the file once per step, after the gradient
  // norm is known and before the next forward, so none of it hides behind compute or comm.
  // Offloaded parameters are the exception: the update writes them without reading them
  // (16-bit: rounded from the master), and every gather reads them first, the forward's and
  // the backward's of each micro-batch (with hpZ the backward's come from memory), in line
  // with compute. `s`: the row's states with `off`, at `shards` ranks.
  const auto io_seconds = [&](const StateBytes& s, int n, int stage, int shards, bool acc,
                              Offload off) {
    double read = static_cast<double>(s.nvme);
    const double write = read;
    if (off == Offload::kParams) {
      const double params = static_cast<double>(
          s.nvme -
          max_model_state_bytes(units, shards, stage, precision, acc, Offload::kOptimizer).nvme);
      if (precision != Precision::kFP32) read -= params;
      read += params * f.grad_accum * (f.hpz && stage == 3 && f.node_ranks > 0 ? 1 : 2);
    }
    return (read / disk->read + write / disk->write) * disk_sharers(n);
  };
  std::optional<Model> built;
  if (gpt) built = make_gpt(*gpt);
  // Recomputing forward under --checkpoint-activations adds a third of the model FLOPs.
  const auto flops_per_step = [&](int n) {
    if (!gpt) return 0.0;
    double phi = 0;
    for (uint64_t u : units) phi += static_cast<double>(u);
    const double per_token = training_flops_per_token(phi, gpt->layers, gpt->seq_len, gpt->embd);
    const double tokens = static_cast<double>(f.micro_batch) * gpt->seq_len * f.grad_accum;
    (void)n;
    return per_token * tokens * (f.checkpoint_activations ? 4.0 / 3.0 : 1.0);
  };

  // A row's memory per rank (rank 0, the largest): its states and, for a GPT shape, every
  // transient buffer, as train would allocate them at `n` ranks with or without offload.
  struct RowPlan {
    AccumulatePolicy policy = AccumulatePolicy::kLocal;
    bool hsdp = false;
    int shards = 1;
    bool canonical = false;
    bool accumulator = false;
    StateBytes states;
    std::optional<TransientBytes> transients;
    uint64_t need = 0;
  };
  const auto plan_row = [&](int n, int stage, Offload asked) {
    const Offload off = stage_offload(asked, stage);
    RowPlan r;
    // As train resolves them: --invariant on makes reduce the default.
    r.policy = accumulate.value_or(default_accumulate(stage, f.grad_accum, invariant));
    // HSDP: stages 1-3 shard the states over a node's ranks, one replica per node.
    r.hsdp = f.shard_within_node && stage >= 1;
    r.shards = r.hsdp ? f.node_ranks : n;
    r.canonical = invariant.value_or(r.policy == AccumulatePolicy::kReduce && !two_level &&
                                     qgz_bits == 0 && !r.hsdp);
    r.accumulator = r.canonical && f.grad_accum > 1;
    r.states = max_model_state_bytes(units, r.shards, stage, precision, r.accumulator, off);
    // Offload excludes qwZ (it quantizes from the master on disk).
    const bool qwz = f.qwz && off == Offload::kNone;
    if (built) {
      r.transients = transient_bytes(
          *built,
          TransientPlan{.world = r.shards,
                        .stage = stage,
                        .precision = precision,
                        .policy = r.policy,
                        .grad_accum = f.grad_accum,
                        .canonical = r.canonical,
                        .prefetch = f.prefetch,
                        .checkpoint_activations = f.checkpoint_activations,
                        .micro_batch = f.micro_batch,
                        .seq_len = gpt->seq_len,
                        .hpz_node_ranks = f.hpz && stage == 3 ? f.node_ranks : 0,
                        .qwz_block = qwz && stage == 3 ? static_cast<size_t>(f.qwz_block) : 0,
                        .offload = off},
          0);
    }
    r.need = r.states.total() + (r.transients ? r.transients->total() : 0);
    return r;
  };

  nlohmann::json rows = nlohmann::json::array();
  if (!f.json) {
    fmt::print("{}\n{}; model states and comm per step per rank (rank 0, the largest)\n", model,
               precision_name(precision));
    if (f.grad_accum > 1 && invariant.value_or(true)) {
      fmt::print(
          "--grad-accum {}: the canonical gradient order (the same bits on any rank count) {}: "
          "an fp32 accumulator, grads at 4 bytes per owned element at stages 2-3 "
          "(docs/determinism.md)\n",
          f.grad_accum, invariant ? "at every stage" : "where the policy is reduce");
    }
    if (gpt) {
      fmt::print(
          "activations for micro-batch {} x {} tokens{}; peak/rank = states + activations "
          "+ workspace + buffers\n",
          f.micro_batch, gpt->seq_len,
          f.checkpoint_activations ? ", activation checkpointing" : "");
    }
    if (offload) {
      fmt::print(
          "--offload optimizer: master weights{} and Adam moments in a file per rank (nvme, "
          "not in per rank), streamed through the update in pieces (peak/rank counts the "
          "staging)\n",
          precision == Precision::kFP32 ? " (none at fp32: the params are the master)" : "");
      if (offload_flag == Offload::kParams) {
        fmt::print(
            "--offload optimizer,params: at stage 3 the parameter shards too, read before "
            "every gather (stages 0-2 offload the optimizer only: every rank computes on "
            "its full copy)\n");
      }
    }
    if (timed) {
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
          ranks_per_disk     ? fmt::format("--ranks-per-disk {}", *ranks_per_disk)
          : f.node_ranks > 0 ? fmt::format("a node's {}", f.node_ranks)
                             : std::string("all the row's ranks: one machine"),
          offload_flag == Offload::kParams
              ? "; offloaded parameters are read for every gather (2 per micro-batch, 1 with "
                "hpZ) and written once, not read, by the update"
              : "",
          timed ? "; bound: the largest of compute s, comm s and io s" : "");
    }
    fmt::print("{:>6} {:>5} {:>11} {:>11} {:>11} {:>11} {:>11}", "ranks", "stage", "params",
               "grads", "master", "adam m+v", "per rank");
    if (offload) fmt::print(" {:>11}", "nvme");
    fmt::print(" {:>13} {:>13} {:>5}", "all ranks", "comm/step", "fits");
    if (f.node_ranks > 0) fmt::print(" {:>11}", "cross-node");
    if (gpt) fmt::print(" {:>11} {:>11}", "activations", "peak/rank");
    if (timed && disk) {
      fmt::print(" {:>9} {:>9} {:>9} {:>9} {:>7}", "compute s", "comm s", "io s", "step s",
                 "bound");
    } else if (timed) {
      fmt::print(" {:>9} {:>9} {:>9}", "compute s", "comm s", "step s");
    } else if (disk) {
      fmt::print(" {:>9}", "io s");
    }
    fmt::print("\n");
  }
  for (int n : f.ranks) {
    std::optional<int> cheapest;
    std::optional<size_t> stage3_row;  // in `rows`
    for (int stage : stages) {
      const RowPlan rp = plan_row(n, stage, offload_flag);
      const Offload row_offload = stage_offload(offload_flag, stage);
      const AccumulatePolicy policy = rp.policy;
      const bool hsdp = rp.hsdp;
      const int shards = rp.shards;
      const bool canonical = rp.canonical;
      const StateBytes& s = rp.states;
      const std::optional<TransientBytes>& t = rp.transients;
      const uint64_t need = rp.need;
      // Offload moves master, adam_m and adam_v of every rank to disk: what memory keeps of
      // all ranks' states is their params and grads (their grads alone with the params).
      const StateBytes a =
          all_ranks_model_state_bytes(units, shards, stage, precision, rp.accumulator);
      const uint64_t kept = row_offload == Offload::kParams      ? a.grads
                            : row_offload == Offload::kOptimizer ? a.params + a.grads
                                                                 : a.total();
      const uint64_t all = kept * static_cast<uint64_t>(n / shards);
      const CommModes modes{.node_ranks = f.node_ranks,
                            .two_level = two_level,
                            .hpz = f.hpz && stage == 3,
                            .qwz_block = f.qwz && stage == 3 ? static_cast<size_t>(f.qwz_block) : 0,
                            .qgz_bits = qgz_bits,
                            .qgz_block = f.qgz_block,
                            .shard_within_node = hsdp};
      const CommBytes c = comm_bytes_per_step(units, n, stage, precision, f.grad_accum, policy,
                                              canonical, 0, modes);
      const double io = disk ? io_seconds(s, n, stage, shards, rp.accumulator, row_offload) : 0.0;
      std::optional<StepTime> time;
      if (timed) {
        StepTime st;
        st.compute = compute_seconds ? *compute_seconds : flops_per_step(n) / *flops;
        const double U = static_cast<double>(units.size());
        const double A = f.grad_accum;
        const StagePlan sp = StagePlan::make(stage, policy, canonical && f.grad_accum > 1);
        const bool during_backward = sp.micro_batch_reduce != StagePlan::Reduce::kNone;
        const double a_red = during_backward ? A : 1;
        const int per_node = f.node_ranks > 0 ? f.node_ranks : n;
        const bool spans = per_node < n;
        const bool levels = (two_level || hsdp) && spans && per_node > 1;
        const LinkModel link{.bandwidth = bandwidth.value_or(0),
                             .latency = latency.value_or(0),
                             .inter_bandwidth = inter_bandwidth.value_or(0),
                             .inter_latency = inter_latency.value_or(0),
                             .nic_ranks = static_cast<double>(per_node)};
        // `bytes` of which `cross` between nodes, over `calls` collectives of `phases` ring
        // passes each (2 for an all-reduce).
        // qgZ's reduce-scatter runs in two levels whatever --collectives says.
        const auto cost = [&](uint64_t bytes, uint64_t cross, double calls, double phases,
                              bool two_levels) {
          const double total = static_cast<double>(bytes);
          if (two_levels) {
            const double p = static_cast<double>(n / per_node);
            return link.two_level_seconds(total - static_cast<double>(cross),
                                          calls * phases * (per_node - 1),
                                          static_cast<double>(cross), calls * phases * (p - 1));
          }
          return link.flat_seconds(total, static_cast<double>(cross), calls * phases * (n - 1),
                                   spans);
        };
        const StagePlan::Reduce kind = during_backward ? sp.micro_batch_reduce : sp.boundary_reduce;
        const double reduce = kind == StagePlan::Reduce::kAllReduce
                                  ? cost(c.all_reduce, c.cross_all_reduce, U * a_red, 2, levels)
                                  : cost(c.reduce_scatter, c.cross_reduce_scatter, U * a_red, 1,
                                         levels || qgz_bits != 0);
        (during_backward ? st.comm_overlap : st.comm_serial) += reduce;
        if (sp.gather_before_compute) {
          st.comm_overlap += cost(c.all_gather, c.cross_all_gather, U * 2 * A, 1, levels);
        } else if (sp.gather_after_update || sp.gather_grads) {
          st.comm_serial += cost(c.all_gather, c.cross_all_gather, U, 1, levels);
        }
        time = st;
      }
      const bool fits = !budget || need <= *budget;
      if (fits && !cheapest) cheapest = stage;
      if (f.json) {
        if (stage == 3) stage3_row = rows.size();
        rows.push_back(
            {{"ranks", n},
             {"stage", stage},
             {"precision", std::string(precision_name(precision))},
             {"accumulate", std::string(accumulate_name(policy))},
             {"invariant", canonical ? "on" : "off"},
             {"collectives", std::string(collectives_name(two_level))},
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
               {"total", c.total()},
               {"cross_node",
                {{"all_reduce", c.cross_all_reduce},
                 {"reduce_scatter", c.cross_reduce_scatter},
                 {"all_gather", c.cross_all_gather},
                 {"total", c.cross_total()}}}}},
             {"transient_bytes", t ? nlohmann::json{{"activations", t->activations},
                                                    {"workspace", t->workspace},
                                                    {"gathered", t->gathered},
                                                    {"grad_buckets", t->grad_buckets},
                                                    {"grad_accum", t->grad_accum},
                                                    {"comm_buffers", t->comm_buffers},
                                                    {"hpz_params", t->hpz_params},
                                                    {"total", t->total()}}
                                   : nlohmann::json()},
             {"peak_bytes", t ? nlohmann::json(need) : nlohmann::json()},
             {"step_seconds", time ? nlohmann::json{{"compute", time->compute},
                                                    {"comm", time->comm()},
                                                    {"comm_overlappable", time->comm_overlap},
                                                    {"serial", time->serial()},
                                                    {"overlapped", time->overlapped()}}
                                   : nlohmann::json()},
             {"fits", budget ? nlohmann::json(fits) : nlohmann::json()}});
        // Offload's keys only where it is asked for: rows without it read as they always did.
        if (offload) {
          nlohmann::json& row = rows.back();
          row["offload"] = std::string(offload_name(row_offload));
          row["model_state_bytes"]["nvme"] = s.nvme;
          if (t) row["transient_bytes"]["offload_staging"] = t->offload_staging;
          if (disk) {
            row["io_seconds"] = io;
            row["ranks_per_disk"] = disk_sharers(n);
            if (time) {
              row["step_seconds"]["io"] = io;
              row["step_seconds"]["predicted"] = offload_step(*time, io, stage, f.offload_overlap);
              row["step_seconds"]["bound"] = bound(*time, io);
            }
          }
        }
      } else {
        fmt::print("{:>6} {:>5} {:>11} {:>11} {:>11} {:>11} {:>11}", n, stage, gb(s.params),
                   gb(s.grads), gb(s.master), gb(s.adam_m + s.adam_v), gb(s.total()));
        if (offload) fmt::print(" {:>11}", gb(s.nvme));
        fmt::print(" {:>13} {:>13} {:>5}", gb(all), gb(c.total()),
                   budget ? (fits ? "yes" : "no") : "-");
        if (f.node_ranks > 0) fmt::print(" {:>11}", gb(c.cross_total()));
        if (t) fmt::print(" {:>11} {:>11}", gb(t->activations), gb(need));
        if (time && disk) {
          fmt::print(" {:>9.3g} {:>9.3g} {:>9.3g} {:>9.3g} {:>7}", time->compute, time->comm(), io,
                     offload_step(*time, io, stage, f.offload_overlap), bound(*time, io));
        } else if (time) {
          fmt::print(" {:>9.3g} {:>9.3g} {:>9.3g}", time->compute, time->comm(),
                     time->overlapped());
        } else if (disk) {
          fmt::print(" {:>9.3g}", io);
        }
        fmt::print("\n");
      }
    }
    if (budget && !f.json) {
      if (cheapest) {
        fmt::print("  -> {} ranks: stage {} is the least communication whose {} fit {}\n", n,
                   *cheapest,
                   gpt ? "states, activations and buffers"
                       : "model states (activations "
                         "and buffers come on top)",
                   gb(*budget));
      } else {
        // Stages 2-3 reduce by default, so the canonical order unless --invariant off.
        const bool accumulator3 =
            invariant.value_or(!two_level && qgz_bits == 0) && f.grad_accum > 1;
        std::string why;
        if (!offload) {
          // The clause below prices offload by all a rank holds, not by its states alone.
          why = budget_advice(units, n, precision, *budget, accumulator3, /*name_offload=*/false);
        } else {
          why = offload_advice(units, n, precision, *budget, accumulator3, built.has_value(),
                               offload_flag);
        }
        if (built) {
          // What the activations would need with less of them kept, at stage 3.
          const auto at_stage3 = [&](bool ckpt, int b) {
            const auto tb =
                transient_bytes(*built,
                                TransientPlan{.world = n,
                                              .stage = 3,
                                              .precision = precision,
                                              .policy = AccumulatePolicy::kReduce,
                                              .grad_accum = f.grad_accum,
                                              .canonical = accumulator3,
                                              .prefetch = f.prefetch,
                                              .checkpoint_activations = ckpt,
                                              .micro_batch = b,
                                              .seq_len = gpt->seq_len,
                                              .hpz_node_ranks = f.hpz ? f.node_ranks : 0,
                                              .offload = offload_flag},
                                0);
            return max_model_state_bytes(units, n, 3, precision, accumulator3, offload_flag)
                       .total() +
                   tb.total();
          };
          const uint64_t ck = at_stage3(true, f.micro_batch);
          const uint64_t small = at_stage3(f.checkpoint_activations, 1);
          why = fmt::format(
              "{}; at stage 3 with --checkpoint-activations a rank needs {} ({}), with "
              "--micro-batch 1 {} ({})",
              why, gb(ck), ck <= *budget ? "fits" : "does not fit", gb(small),
              small <= *budget ? "fits" : "does not fit");
        }
        if (!offload) {
          // The least communication that fits once the optimizer's states are on disk, at
          // the run's other flags; else the least memory.
          // Stages 0-3 with the optimizer offloaded, then stage 3 with its parameters too.
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
          std::vector<RowPlan> with;
          for (const Offer& o : offers) {
            with.push_back(plan_row(n, o.stage, o.offload));
            if (!fit && with.back().need <= *budget) fit = with.size() - 1;
            if (with.back().need < with[least].need) least = with.size() - 1;
          }
          const std::string what = gpt ? "states, activations and buffers" : "model states";
          if (fit) {
            const RowPlan& r = with[*fit];
            why += fmt::format(
                "; with --offload {}{} stage {} fits: {} per rank in memory ({}), {} per "
                "rank on disk (--disk-bandwidth prices its reads and writes)",
                offload_name(offers[*fit].offload), f.qwz ? " in place of --qwz" : "",
                offers[*fit].stage, gb(r.need), what, gb(r.states.nvme));
          } else {
            why += fmt::format(
                "; --offload{} does not fit either: the least is stage {}'s {} per rank in "
                "memory ({}) with --offload {}",
                f.qwz ? " in place of --qwz" : "", offers[least].stage, gb(with[least].need), what,
                offload_name(offers[least].offload));
          }
        }
        fmt::print("  -> {} ranks: no stage fits {}; {}\n", n, gb(*budget), why);
      }
    }
    if (f.node_ranks > 0 && f.node_ranks < n &&
        std::find(stages.begin(), stages.end(), 3) != stages.end()) {
      const AccumulatePolicy policy3 =
          accumulate.value_or(default_accumulate(3, f.grad_accum, invariant));
      // As the stage-3 row computes `need`, without the user's --hpz or --qwz: each mode
      // adds its own.
      const auto base_need = [&](bool canonical, int shards) {
        const bool accumulator3 = canonical && f.grad_accum > 1;
        uint64_t need =
            max_model_state_bytes(units, shards, 3, precision, accumulator3, offload_flag).total();
        if (built) {
          need += transient_bytes(*built,
                                  TransientPlan{.world = shards,
                                                .stage = 3,
                                                .precision = precision,
                                                .policy = policy3,
                                                .grad_accum = f.grad_accum,
                                                .canonical = canonical,
                                                .prefetch = f.prefetch,
                                                .checkpoint_activations = f.checkpoint_activations,
                                                .micro_batch = f.micro_batch,
                                                .seq_len = gpt->seq_len,
                                                .offload = offload_flag},
                                  0)
                      .total();
        }
        return need;
      };
      const std::vector<ModeRow> mode_rows = node_mode_rows(
          units, n, f.node_ranks, precision, f.grad_accum, policy3, invariant, offload, f.prefetch,
          static_cast<size_t>(f.qwz_block), f.qgz_block, bandwidth, inter_bandwidth, base_need);
      const ModeChoice choice = choose_mode(mode_rows, budget);
      if (!f.json) {
        print_node_modes(mode_rows, choice, n, f.node_ranks, budget, invariant, built.has_value());
      } else if (stage3_row) {
        const ModeRow& p = mode_rows[choice.pick];
        nlohmann::json& row = rows[*stage3_row];
        row["node_modes"] = node_modes_json(mode_rows, budget);
        row["node_mode_choice"] = {
            {"mode", p.mode.name},
            {"flags", p.mode.flags},
            {"by", choice.by_seconds ? "seconds" : "cross_node_bytes"},
            {"fits", budget ? nlohmann::json(choice.fits) : nlohmann::json()},
            {"need_bytes", p.need},
            {"over_bytes", choice.fits ? 0 : p.need - *budget},
            {"quantized", quantizes(p.mode.modes)}};
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
  app.add_option("--node-ranks", f->node_ranks,
                 "Ranks per node: also show the comm bytes per step that cross nodes "
                 "(docs/topology.md)");
  app.add_flag("--shard-within-node", f->shard_within_node,
               "Stages 1-3: shard the states over each node's ranks, one replica per node "
               "(HSDP; needs --node-ranks)");
  app.add_flag("--hpz", f->hpz,
               "Stage 3: count hpZ's secondary copy (params / T per rank) and its backward "
               "gathers inside the node (needs --node-ranks)");
  app.add_flag("--qwz", f->qwz,
               "Stage 3: count the parameter gathers as int8 blocks with an fp32 scale each");
  const CLI::Range block_range(static_cast<int>(kQuantBlockRange.min),
                               static_cast<int>(kQuantBlockRange.max));
  app.add_option("--qwz-block", f->qwz_block, "Elements per quantization scale (--qwz)")
      ->check(block_range)
      ->capture_default_str();
  app.add_option("--qgz", f->qgz,
                 "Count the gradients' reduce-scatter (stage 0: all-reduce's half) as off, int8 or "
                 "int4 blocks")
      ->capture_default_str();
  app.add_option("--qgz-block", f->qgz_block, "Elements per quantization scale (--qgz)")
      ->check(block_range)
      ->capture_default_str();
  app.add_option("--collectives", f->collectives,
                 "flat or two-level (with --node-ranks): the collectives whose bytes and time "
                 "to count")
      ->capture_default_str();
  app.add_option("--invariant", f->invariant,
                 "on, off or auto (on under reduce): the canonical gradient order, whose fp32 "
                 "accumulator and stage-0 traffic the estimate then counts")
      ->capture_default_str();
  app.add_option("--memory-per-rank", f->memory_per_rank, "Budget per rank, e.g. 80GB");
  app.add_option("--micro-batch", f->micro_batch, "GPT: sequences per rank per micro-batch")
      ->capture_default_str();
  app.add_option("--prefetch", f->prefetch, "Stage 3: units gathered ahead")->capture_default_str();
  app.add_flag("--checkpoint-activations", f->checkpoint_activations,
               "Keep only unit inputs; recompute in backward");
  app.add_option("--flops", f->flops,
                 "Sustained FLOP/s per rank for the step-time estimate, e.g. 365e9");
  app.add_option("--compute-seconds", f->compute_seconds,
                 "Or a step's compute per rank as measured, e.g. 0.219 (a run's step time "
                 "without a simulated link)");
  app.add_option("--link-bandwidth", f->link_bandwidth, "Per-rank link bandwidth, e.g. 10GB/s");
  app.add_option("--link-latency", f->link_latency, "Per ring step latency, e.g. 20us");
  app.add_option("--inter-node-bandwidth", f->inter_node_bandwidth,
                 "The link between nodes (with --node-ranks; default: --link-bandwidth), e.g. "
                 "1GB/s");
  app.add_option("--inter-node-latency", f->inter_node_latency,
                 "Per step latency between nodes (with --node-ranks), e.g. 50us");
  app.add_option("--offload", f->offload,
                 "none or optimizer: count train --offload optimizer, whose fp32 master weights "
                 "(16-bit runs) and Adam moments live in a file per rank: memory keeps params, "
                 "grads and two staging slots, and the nvme column gives the file's bytes per "
                 "rank (12 B per optimizer element at bf16/fp16, 8 at fp32, in 4 KiB blocks); "
                 "optimizer,params: at stage 3 the parameter shards too (2 B more per element, "
                 "4 at fp32), read for every gather")
      ->capture_default_str();
  app.add_option("--disk-bandwidth", f->disk_bandwidth,
                 "With --offload optimizer: the disk's bytes per second, one figure for reads and "
                 "writes or READ/WRITE, e.g. 2GB/s, 2.1GB/s/1.0GB/s or 2138e6/1031e6 (zerodp "
                 "bench-io DIR measures them); adds io s = nvme/READ + nvme/WRITE per step, "
                 "times the ranks sharing the disk, to the step time");
  app.add_option("--offload-overlap", f->offload_overlap,
                 "As train's: at stages 0 and 3 the next forward runs beside the update's I/O, "
                 "hiding up to a third of the compute (on/off)")
      ->capture_default_str();
  app.add_option("--ranks-per-disk", f->ranks_per_disk,
                 "With --disk-bandwidth: ranks whose files share one disk's bandwidth, e.g. 8 "
                 "(default: --node-ranks, else every rank of the row: one machine)");
  app.add_flag("--json", f->json, "One JSON array of rows on stdout");
  return [f](Launch) { return run_estimate(*f); };
}

}  // namespace zerodp::cli
