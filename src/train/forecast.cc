// The forecast of a configuration's memory, traffic and step time; forecast.h is the contract.
#include "train/forecast.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <optional>

#include <fmt/core.h>

#include "comm/link_model.h"
#include "core/units.h"
#include "train/run_check.h"
#include "train/stage_plan.h"

namespace zerodp {

double offload_step_seconds(const StepTime& t, double io, int stage, bool overlap) {
  const double hidden = overlap && (stage == 0 || stage == 3) ? std::min(io, t.compute / 3) : 0;
  return t.overlapped() + io - hidden;
}

std::string_view step_bound(const StepTime& t, double io) {
  if (io > t.compute && io > t.comm()) return "io";
  return t.comm() > t.compute ? "comm" : "compute";
}

Offload stage_offload(Offload asked, int stage) {
  return asked == Offload::kParams && stage != 3 ? Offload::kOptimizer : asked;
}

TrainConfig row_config(const TrainConfig& asked, int ranks, int stage, Offload offload) {
  TrainConfig c = asked;
  c.launch.ranks = ranks;
  c.stage = stage;
  c.offload = stage_offload(offload, stage);
  c.hpz = asked.hpz && stage == 3;
  // Offload excludes qwZ: it quantizes from the master, which is on disk.
  c.qwz = asked.qwz && stage == 3 && c.offload == Offload::kNone;
  c.shard_within_node = asked.shard_within_node && stage >= 1;
  if (c.accumulate_default) {
    c.accumulate = default_accumulate(stage, c.grad_accum, c.invariant);
    c.accumulate_default = false;
  }
  return c;
}

namespace {

// The fewest ranks, from `world` on, with which stage 3's states of `c` fit (`fits`), or none
// up to 2^20, among the rank counts a run of `c` can have (`launchable`, the world's rule).
// Those are multiples of I T (whole nodes of T, I islands of whole nodes; apart from in turn)
// and, below I T, I islands sharing a node: the candidates proposed here, which the rule
// decides. A rank's states shrink as the ranks grow, so a doubling then a bisection over the
// multiples finds the fewest; `fits` is asked of launchable counts alone (rank_holdings refuses
// the others).
std::optional<int> fewest_ranks(const TrainConfig& c, int world,
                                const std::function<bool(int)>& fits) {
  const int t = c.launch.comm.node_ranks > 0 ? c.launch.comm.node_ranks : 1;
  const int islands = c.islands > 1 && !c.islands_in_turn ? c.islands : 1;
  for (int d = 1; islands > 1 && d < t; ++d) {  // islands inside a node
    const int n = islands * d;
    if (n >= world && launchable(c, n) && fits(n)) return n;
  }
  const int q = islands * t;
  constexpr int kMost = 1 << 20;
  const int first = std::max(1, (world + q - 1) / q);
  int k = first;
  while (k * q < kMost && !fits(k * q)) k *= 2;
  int lo = std::max(first, k / 2), hi = k;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (fits(mid * q)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return fits(hi * q) ? std::optional<int>(hi * q) : std::nullopt;
}

}  // namespace

std::string budget_advice(const TrainConfig& c, const PlannedModel& m, int world,
                          uint64_t budget_bytes, bool name_offload) {
  // Model states only: the sentence compares states with the budget, whatever the buffers.
  const PlannedModel states_of{.units = m.units, .tensors = m.tensors};
  const auto states = [&](int stage, int ranks, Offload offload) {
    return rank_holdings(row_config(c, ranks, stage, offload), states_of, ranks, 0).states.total();
  };
  const auto fits = [&](int stage, int ranks) {
    return states(stage, ranks, c.offload) <= budget_bytes;
  };
  std::string s =
      c.offload == Offload::kNone
          ? fmt::format("model states per rank at {} ranks:", world)
          : fmt::format("model states in memory per rank with --offload {} at {} ranks:",
                        offload_name(c.offload), world);
  for (int stage = 0; stage <= 3; ++stage) {
    const uint64_t need = states(stage, world, c.offload);
    s += fmt::format(" stage {} {}{}{}", stage, format_bytes(static_cast<double>(need)),
                     need <= budget_bytes ? " (fits)" : "", stage < 3 ? "," : "");
  }
  // Offload keeps only the params and grads in memory; worth naming when no stage fits here.
  if (name_offload && c.offload == Offload::kNone && !fits(3, world)) {
    std::optional<std::string> named;
    for (int stage = 0; stage <= 3 && !named; ++stage) {
      const uint64_t need = states(stage, world, Offload::kOptimizer);
      if (need <= budget_bytes) {
        named = fmt::format("; with --offload optimizer, stage {} would hold {} in memory", stage,
                            format_bytes(static_cast<double>(need)));
      }
    }
    // Then only the gradients stay: stage 3 with its parameter shards on disk too.
    const uint64_t need = states(3, world, Offload::kParams);
    if (!named && need <= budget_bytes) {
      named = fmt::format("; with --offload optimizer,params, stage 3 would hold {} in memory",
                          format_bytes(static_cast<double>(need)));
    }
    s += named.value_or("");
  }
  const std::string tail =
      " (activations and buffers come on top; zerodp never changes stage by itself)";
  // Naming a rank count when the states already fit would send the user after the wrong
  // cause.
  if (fits(0, world)) {
    return s + "; every stage's states fit, so it is the activations and buffers that do not";
  }
  if (fits(3, world)) return s + "; use a stage marked (fits)" + tail;
  if (const auto n = fewest_ranks(c, world, [&](int ranks) { return fits(3, ranks); })) {
    return s + fmt::format("; stage 3 needs at least {} ranks for the states to fit", *n) + tail;
  }
  if (row_config(c, world, 3, c.offload).shard_within_node) {
    // HSDP shards over a node whatever the nodes: only more ranks per node would shrink them.
    return s +
           fmt::format(
               "; --shard-within-node shards them over a node's {} ranks, so no rank "
               "count makes them fit",
               c.launch.comm.node_ranks) +
           tail;
  }
  return s + "; no rank count makes the states fit" + tail;
}

namespace {

// Training FLOPs of one step per rank; recomputing forward under --checkpoint-activations adds
// a third.
double flops_per_step(const TrainConfig& c, const PlannedModel& m) {
  double phi = 0;
  for (uint64_t u : m.units) phi += static_cast<double>(u);
  const double per_token = training_flops_per_token(phi, m.layers, m.seq_len, m.embd);
  const double tokens = static_cast<double>(c.micro_batch) * m.seq_len * c.grad_accum;
  return per_token * tokens * (c.checkpoint_activations ? 4.0 / 3.0 : 1.0);
}

// The communication of a step in seconds, by when the engine issues it (StepTime).
void price_comm(const TrainConfig& c, const CommBytes& bytes, double units, const StepInputs& in,
                StepTime& st) {
  const int n = c.launch.ranks;
  const int node_ranks = c.launch.comm.node_ranks;
  const double A = c.grad_accum;
  const StagePlan sp = StagePlan::make(c.stage, c.accumulate, fp32_accumulator(c));
  const bool during_backward = sp.micro_batch_reduce != StagePlan::Reduce::kNone;
  const double a_red = during_backward ? A : 1;
  const int per_node = node_ranks > 0 ? node_ranks : n;
  const bool spans = per_node < n;
  const bool levels = (c.launch.comm.two_level || c.shard_within_node) && spans && per_node > 1;
  const LinkModel link{.bandwidth = in.bandwidth.value_or(0),
                       .latency = in.latency.value_or(0),
                       .inter_bandwidth = in.inter_bandwidth.value_or(0),
                       .inter_latency = in.inter_latency.value_or(0),
                       .nic_ranks = static_cast<double>(per_node)};
  // `total` bytes of which `cross` between nodes, over `calls` collectives of `phases` ring
  // passes each (2 for an all-reduce).
  const auto cost = [&](uint64_t total, uint64_t cross, double calls, double phases,
                        bool two_levels) {
    if (two_levels) {
      const double p = static_cast<double>(n / per_node);
      return link.two_level_seconds(static_cast<double>(total) - static_cast<double>(cross),
                                    calls * phases * (per_node - 1), static_cast<double>(cross),
                                    calls * phases * (p - 1));
    }
    return link.flat_seconds(static_cast<double>(total), static_cast<double>(cross),
                             calls * phases * (n - 1), spans);
  };
  // qgZ's reduce-scatter runs in two levels whatever --collectives says.
  const StagePlan::Reduce kind = during_backward ? sp.micro_batch_reduce : sp.boundary_reduce;
  const double reduce =
      kind == StagePlan::Reduce::kAllReduce
          ? cost(bytes.all_reduce, bytes.cross_all_reduce, units * a_red, 2, levels)
          : cost(bytes.reduce_scatter, bytes.cross_reduce_scatter, units * a_red, 1,
                 levels || c.launch.comm.qgz_bits != 0);
  (during_backward ? st.comm_overlap : st.comm_serial) += reduce;
  if (during_backward) st.backward_reduce += reduce;
  if (sp.gather_before_compute) {
    st.comm_overlap += cost(bytes.all_gather, bytes.cross_all_gather, units * 2 * A, 1, levels);
  } else if (sp.gather_after_update || sp.gather_grads) {
    st.comm_serial += cost(bytes.all_gather, bytes.cross_all_gather, units, 1, levels);
  }
}

// The update reads and writes every byte of the file once per step, after the gradient norm
// is known and before the next forward, so none of it hides behind compute or comm. Offloaded
// parameters are the exception: the update writes them without reading them (16-bit: rounded
// from the master), and every gather reads them first, the forward's and the backward's of
// each micro-batch (with hpZ the backward's come from memory), in line with compute.
double io_seconds(const TrainConfig& c, const PlannedModel& m, const StateBytes& s, int shards,
                  const DiskBandwidth& disk, int sharers) {
  double read = static_cast<double>(s.nvme);
  const double write = read;
  if (c.offload == Offload::kParams) {
    const double params =
        static_cast<double>(s.nvme - max_model_state_bytes(m.units, shards, c.stage, c.precision,
                                                           fp32_accumulator(c), Offload::kOptimizer)
                                         .nvme);
    if (c.precision != Precision::kFP32) read -= params;
    read += params * c.grad_accum * (c.hpz && c.stage == 3 ? 1 : 2);
  }
  return (read / disk.read + write / disk.write) * sharers;
}

}  // namespace

namespace {

// A run of one world (no islands) but for its holdings, which forecast() takes from
// rank_holdings: what memory keeps of every rank's states, the comm, the offload file's I/O
// and the step's time.
Forecast forecast_world(const TrainConfig& c, const PlannedModel& m, const StepInputs& in) {
  const int n = c.launch.ranks;
  const int shards = shard_ranks(c, n);
  const bool accumulator = fp32_accumulator(c);
  Forecast f;
  const UnitTensors* int8 = c.int8_moments ? &m.tensors : nullptr;
  // Offload moves master, adam_m and adam_v of every rank to disk: what memory keeps of all
  // ranks' states is their params and grads (their grads alone with the params).
  const StateBytes a =
      all_ranks_model_state_bytes(m.units, shards, c.stage, c.precision, accumulator, int8);
  const uint64_t kept = c.offload == Offload::kParams      ? a.grads
                        : c.offload == Offload::kOptimizer ? a.params + a.grads
                                                           : a.total();
  f.all_ranks = kept * static_cast<uint64_t>(n / shards);
  f.comm = comm_bytes_per_step(m.units, n, c.stage, c.precision, c.grad_accum, c.accumulate,
                               canonical_order(c), 0, comm_modes_of(c));
  if (in.disk) {
    const int node_ranks = c.launch.comm.node_ranks;
    f.disk_sharers = std::min(in.ranks_per_disk.value_or(node_ranks > 0 ? node_ranks : n), n);
    const StateBytes states = rank_holdings(c, m, n, 0).states;
    f.io = io_seconds(c, m, states, shards, *in.disk, f.disk_sharers);
  }
  if (m.model && (in.flops || in.compute_seconds)) {
    StepTime st;
    st.compute = in.compute_seconds ? *in.compute_seconds : flops_per_step(c, m) / *in.flops;
    // Forward is 2 of the 6 FLOPs per parameter and token; recomputing it under
    // --checkpoint-activations puts 2 more in backward.
    st.forward = st.compute * (c.checkpoint_activations ? 0.25 : 1.0 / 3.0);
    price_comm(c, f.comm, static_cast<double>(m.units.size()), in, st);
    f.time = st;
  }
  return f;
}

// The outer round's seconds at the links, per step: serial, unless --outer-delay overlaps it.
void price_outer(const TrainConfig& c, const IslandLayout& l, const StepInputs& in,
                 Forecast::Outer& o, StepTime& t) {
  // Every rank of a node runs its column's all-reduce at once: they share the node's link.
  const int per_node = c.launch.comm.node_ranks > 0 ? c.launch.comm.node_ranks : l.ranks;
  const LinkModel link{.bandwidth = in.bandwidth.value_or(0),
                       .latency = in.latency.value_or(0),
                       .inter_bandwidth = in.inter_bandwidth.value_or(0),
                       .inter_latency = in.inter_latency.value_or(0),
                       .nic_ranks = static_cast<double>(std::min(per_node, l.ranks))};
  // An all-reduce's ring steps, or a quantized exchange's all-gather's (the island's small
  // all-reduce of block maxima stays inside a node when islands are, and is left out).
  const double steps = (l.quant_bits != 0 ? 1.0 : 2.0) * (l.islands - 1) * l.fragments;
  o.round_seconds = link.flat_seconds(static_cast<double>(o.exchange_round.total()),
                                      static_cast<double>(o.exchange_round.cross_total()), steps,
                                      l.across_node_ranks < l.islands);
  const double inner = t.overlapped();
  const auto h = static_cast<double>(c.outer_every);
  (c.outer_delay > 0 ? t.comm_overlap : t.comm_serial) += *o.round_seconds / h;
  if (inner > 0) {
    o.advised_every = std::max<int64_t>(
        1, static_cast<int64_t>(std::ceil(*o.round_seconds / (0.1 * inner) - 1e-9)));
  }
}

// DiLoCo's islands: an island's run, then the outer exchanges on top.
Forecast forecast_islands(const TrainConfig& c, const PlannedModel& m, const StepInputs& in) {
  check_fragments(c, std::accumulate(m.units.begin(), m.units.end(), uint64_t{0}));
  const IslandLayout l = island_layout(c, c.launch.ranks);
  TrainConfig island = c;
  island.islands = 1;
  island.checkpoint_async = false;
  island.launch.ranks = l.ranks;
  island.launch.comm.node_ranks = l.inside_node_ranks;
  Forecast f = forecast_world(island, m, in);
  f.all_ranks *= static_cast<uint64_t>(l.islands);
  if (l.in_turn) {
    // Every rank takes each island's step in turn: its collectives and time once per island.
    const auto k = static_cast<uint64_t>(l.islands);
    f.comm = f.comm.times(k);
    if (f.time) {
      const double s = static_cast<double>(k);
      StepTime& t = *f.time;
      t = {t.compute * s, t.comm_overlap * s, t.comm_serial * s, t.forward * s,
           t.backward_reduce * s};
    }
  }
  Forecast::Outer o;
  o.round = outer_round_bytes(m.units, l, 0);
  o.exchange_round = outer_round_bytes(m.units, l, 0, true);
  for (int k = 0; k < l.fragments; ++k) {
    const CommBytes b = outer_exchange_bytes(m.units, l, 0, k);
    if (b.total() > o.burst.total()) o.burst = b;
  }
  const uint64_t h = static_cast<uint64_t>(c.outer_every);
  f.comm.all_reduce += o.round.all_reduce / h;
  f.comm.cross_all_reduce += o.round.cross_all_reduce / h;
  f.comm.all_gather += o.round.all_gather / h;
  f.comm.cross_all_gather += o.round.cross_all_gather / h;
  if (f.time && (in.inter_bandwidth || in.bandwidth)) price_outer(c, l, in, o, *f.time);
  f.outer = o;
  return f;
}

}  // namespace

Forecast forecast(const TrainConfig& c, const PlannedModel& m, const StepInputs& in) {
  Forecast f = c.islands > 1 ? forecast_islands(c, m, in) : forecast_world(c, m, in);
  const Holdings h = rank_holdings(c, m, c.launch.ranks, 0);
  f.states = h.states;
  f.transients = h.transients;
  f.checkpoint_staging = h.checkpoint_staging;
  f.need = h.memory();
  if (f.outer) f.outer->state = h.outer_state;
  return f;
}

std::vector<NodeMode> node_modes(int node_ranks, size_t qwz_block, size_t qgz_block) {
  std::vector<NodeMode> out;
  const auto add = [&](bool two_level, bool hpz, bool qwz, int qgz_bits) {
    NodeMode m{.name = two_level ? "two-level" : "flat",
               .flags = two_level ? "--collectives two-level" : "",
               .switches = two_level ? 1 : 0,
               .modes = {.node_ranks = node_ranks,
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
  // A budget too small for one mode's memory still finds the best of the rest; qgZ int8,
  // never fewer bytes than int4 at the same memory, is there for its smaller error.
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
                         .modes = {.node_ranks = node_ranks, .shard_within_node = true}});
  return out;
}

bool quantizes(const CommModes& m) { return m.qwz_block > 0 || m.qgz_bits != 0; }

std::vector<ModeForecast> node_mode_forecasts(const TrainConfig& stage3, const PlannedModel& m,
                                              const StepInputs& in) {
  const int n = stage3.launch.ranks;
  const int per_node = stage3.launch.comm.node_ranks;
  const bool offload = stage3.offload != Offload::kNone;
  // The stage-3 run with no mode of its own, in the canonical order or not, its states
  // sharded over the world or (HSDP) a node: what every mode adds to.
  const auto base_need = [&](bool canonical, bool hsdp) {
    TrainConfig b = stage3;
    b.hpz = false;
    b.qwz = false;
    b.launch.comm.two_level = false;
    b.launch.comm.qgz_bits = 0;
    b.shard_within_node = hsdp;
    b.invariant = canonical;
    return forecast(b, m).need;
  };
  std::vector<ModeForecast> rows;
  for (NodeMode& mode :
       node_modes(per_node, static_cast<size_t>(stage3.qwz_block), stage3.launch.comm.qgz_block)) {
    ModeForecast r;
    const CommModes& mm = mode.modes;
    const bool reorders = mm.two_level || mm.qgz_bits != 0 || mm.shard_within_node;
    r.allowed = !(stage3.invariant.value_or(false) && reorders) && !(offload && mm.qwz_block > 0);
    // A mode --invariant on refuses is priced as the run it would be with the order off.
    const bool canonical =
        stage3.invariant.value_or(stage3.accumulate == AccumulatePolicy::kReduce && !reorders) &&
        !reorders;
    r.comm = comm_bytes_per_step(m.units, n, 3, stage3.precision, stage3.grad_accum,
                                 stage3.accumulate, canonical, 0, mm);
    if (mm.hpz) r.extra += hpz_copy_bytes(m.units, per_node, 0, stage3.precision);
    if (mm.qwz_block > 0) {
      r.extra +=
          static_cast<uint64_t>(1 + stage3.prefetch) * qwz_staging_bytes(m.units, n, mm.qwz_block);
    }
    // HSDP's states cost 1/T instead of 1/N per rank.
    if (mm.shard_within_node) r.extra += base_need(false, true) - base_need(false, false);
    r.need = base_need(canonical, false) + r.extra;
    if (in.bandwidth || in.inter_bandwidth) {
      const double cross = static_cast<double>(r.comm.cross_total());
      const double intra = static_cast<double>(r.comm.total()) - cross;
      // The communicator's own model of the link, bandwidth only here.
      const LinkModel link{.bandwidth = in.bandwidth.value_or(0),
                           .inter_bandwidth = in.inter_bandwidth.value_or(0),
                           .nic_ranks = static_cast<double>(per_node)};
      r.seconds = mm.two_level || mm.shard_within_node
                      ? link.two_level_seconds(intra, 0, cross, 0)
                      : link.flat_seconds(static_cast<double>(r.comm.total()), cross, 0, true);
    }
    r.mode = std::move(mode);
    rows.push_back(std::move(r));
  }
  return rows;
}

ModeChoice choose_mode(std::span<const ModeForecast> rows, std::optional<uint64_t> budget) {
  ModeChoice c;
  c.by_seconds = !rows.empty() && rows[0].seconds.has_value();
  // Seconds are sums of quotients: two modes moving the same bytes can differ in the last
  // bits, which must not outweigh a flag fewer.
  const auto better = [&](const ModeForecast& a, const ModeForecast& b) {
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
    const ModeForecast& r = rows[i];
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

}  // namespace zerodp
