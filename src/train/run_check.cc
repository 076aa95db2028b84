// The rules between options and with the world; run_check.h is the contract. A rule between
// options goes into the part for its topic below; one about a single option's value, or an
// option with nothing to act on, into its table entry (options.h).
#include "train/run_check.h"

#include <algorithm>
#include <optional>

#include <fmt/core.h>

#include "core/error.h"
#include "train/plan.h"

namespace zerodp {

namespace {

// What islands in turn do not do yet, each refused naming why.
void check_islands_in_turn(const TrainConfig& c) {
  if (!c.islands_in_turn) return;
  if (c.islands < 2) {
    throw InvalidArgument(fmt::format(
        "--islands-in-turn runs several islands on the same ranks; --islands {} is not several. "
        "Use --islands 2 or more",
        c.islands));
  }
  if (c.checkpoint_async && c.offload != Offload::kNone) {
    throw InvalidArgument(
        "--islands-in-turn cannot be combined with --checkpoint-async with --offload yet: the "
        "background writer reads one island's offload file while the next step rewrites it; "
        "save synchronously, or keep the states in memory");
  }
}

// DiLoCo's islands: what they cannot be combined with, and Streaming DiLoCo's schedule
// (--fragments dividing --outer-every, --outer-delay below H / F, evaluation where the
// islands agree on the weights).
void check_islands(const TrainConfig& c) {
  check_islands_in_turn(c);
  if (c.islands == 1) return;
  if (c.shard_within_node) {
    throw InvalidArgument(fmt::format(
        "--islands {} cannot be combined with --shard-within-node: the islands already hold a "
        "replica each; shard inside each island with --stage",
        c.islands));
  }
  if (c.outer_every % c.fragments != 0) {
    throw InvalidArgument(fmt::format(
        "--fragments {} does not divide --outer-every {}: each fragment's round is H steps, "
        "one every H / F; use a divisor of {}",
        c.fragments, c.outer_every, c.outer_every));
  }
  if (c.outer_delay >= c.outer_every / c.fragments) {
    throw InvalidArgument(fmt::format(
        "--outer-delay {} is not below --outer-every {} / --fragments {} = {}: one exchange at "
        "a time, each merged before the next starts; use at most {}",
        c.outer_delay, c.outer_every, c.fragments, c.outer_every / c.fragments,
        c.outer_every / c.fragments - 1));
  }
  if (c.eval_every > 0 && (c.fragments > 1 || c.outer_delay > 0)) {
    throw InvalidArgument(fmt::format(
        "--eval-every {} with --fragments {} and --outer-delay {}: the islands hold the same "
        "weights only once every fragment's round has ended and been merged whole, which "
        "streaming does at the run's end only; leave --eval-every out (the run evaluates at "
        "its end)",
        c.eval_every, c.fragments, c.outer_delay));
  }
  if (c.eval_every > 0 && c.eval_every % c.outer_every != 0) {
    throw InvalidArgument(fmt::format(
        "--eval-every {} with --islands: evaluation reads the global weights, which the islands "
        "share only after an outer step (every --outer-every {}); use a multiple of {}",
        c.eval_every, c.outer_every, c.outer_every));
  }
}

// --invariant on: one order of summation for every rank count, which a local sum, node
// partials and quantized partials would each break. A default policy never does.
void check_order(const TrainConfig& c) {
  if (!c.invariant.value_or(false)) return;
  if (!c.accumulate_default && c.accumulate == AccumulatePolicy::kLocal) {
    throw InvalidArgument(
        "--invariant on needs --accumulate reduce: a local sum adds a rank's own micro-batches "
        "before the ranks' sums meet, in an order that depends on the rank count");
  }
  if (c.launch.comm.qgz_bits != 0) {
    throw InvalidArgument(
        "--invariant on needs unquantized gradients: --qgz rounds each node's partial to "
        "blocks, so the sum depends on the ranks per node (docs/determinism.md)");
  }
  if (c.launch.comm.two_level) {
    throw InvalidArgument(
        "--invariant on needs --collectives flat: two-level collectives add each node's ranks "
        "first and round that partial, so the sum depends on the ranks per node "
        "(docs/determinism.md)");
  }
}

// --shard-within-node (HSDP): it needs --node-ranks and a stage that shards (1-3), and stands
// alone among the modes over nodes (its gathers stay in the node and its reduction is
// two-level already) and outside --invariant on.
void check_hsdp(const TrainConfig& c) {
  if (!c.shard_within_node) return;
  if (c.launch.comm.node_ranks == 0) {
    throw InvalidArgument(
        "--shard-within-node shards the states over the ranks of each node; it needs "
        "--node-ranks T to say which ranks share a node");
  }
  if (c.stage == 0) {
    throw InvalidArgument(
        "--shard-within-node shards states inside each node; --stage 0 shards none. Use "
        "--stage 1, 2 or 3");
  }
  const char* other = c.hpz                         ? "--hpz"
                      : c.qwz                       ? "--qwz"
                      : c.launch.comm.qgz_bits != 0 ? "--qgz"
                      : c.launch.comm.two_level     ? "--collectives two-level"
                                                    : nullptr;
  if (other != nullptr) {
    throw InvalidArgument(fmt::format(
        "--shard-within-node already gathers inside each node and reduces in two levels; "
        "{} has nothing to act on with it. Leave {} out",
        other, other));
  }
  if (c.invariant.value_or(false)) {
    throw InvalidArgument(
        "--invariant on needs one order for every rank count, but --shard-within-node adds "
        "each node's ranks first and rounds that partial (docs/determinism.md); use "
        "--invariant auto or off");
  }
}

// The modes over nodes: a link between nodes, hpZ and two-level collectives need --node-ranks
// to say where nodes begin; hpZ and qwZ act on stage 3's gathers alone.
void check_nodes(const TrainConfig& c) {
  const CommOptions& comm = c.launch.comm;
  if (comm.node_ranks == 0 && (comm.inter_node_bandwidth > 0 || comm.inter_node_latency > 0)) {
    throw InvalidArgument(fmt::format(
        "{} needs --node-ranks T to say which ranks share a node",
        comm.inter_node_bandwidth > 0 ? "--inter-node-bandwidth" : "--inter-node-latency"));
  }
  if (c.hpz && c.stage != 3) {
    throw InvalidArgument(fmt::format(
        "--hpz keeps a node's copy of stage 3's gathered parameters; --stage {} gathers none. "
        "Use --stage 3, or leave --hpz out",
        c.stage));
  }
  if (c.qwz && c.stage != 3) {
    throw InvalidArgument(fmt::format(
        "--qwz quantizes stage 3's parameter gathers; --stage {} gathers none. Use --stage 3, or "
        "leave --qwz out",
        c.stage));
  }
  if (c.hpz && comm.node_ranks == 0) {
    throw InvalidArgument(
        "--hpz shards a second copy of the parameters within each node; it needs --node-ranks T "
        "to say which ranks share a node");
  }
  if (comm.two_level && comm.node_ranks == 0) {
    throw InvalidArgument(
        "--collectives two-level needs --node-ranks T to say which ranks share a node");
  }
}

// --offload: what the tier cannot be combined with, and the pieces O_DIRECT's 4 KiB blocks
// need. estimate plans no directory.
void check_offload(const TrainConfig& c, Command command) {
  if (c.offload == Offload::kNone) return;
  if (c.qwz) {
    throw InvalidArgument(fmt::format(
        "--qwz quantizes parameters from the fp32 master, which --offload {} keeps on disk; use "
        "one of the two",
        offload_name(c.offload)));
  }
  if (c.offload == Offload::kParams && c.stage != 3) {
    throw InvalidArgument(fmt::format(
        "--offload optimizer,params puts each rank's parameter shard on disk, and only stage 3 "
        "shards parameters (at stage {} every rank computes on its full copy); use --stage 3, "
        "or --offload optimizer",
        c.stage));
  }
  if (c.offload == Offload::kParams && c.offload_overlap) {
    throw InvalidArgument(
        "--offload-overlap on with --offload optimizer,params: the next forward would read "
        "parameter shards the update is still writing; use --offload-overlap off, or "
        "--offload optimizer");
  }
  if (c.offload == Offload::kParams && c.precision != Precision::kFP32 &&
      c.offload_piece % 2048 != 0) {
    throw InvalidArgument(fmt::format(
        "--offload-piece {} is not a multiple of 2048 elements, which --offload "
        "optimizer,params needs (2-byte parameters fill O_DIRECT's 4 KiB block at 2048); use "
        "e.g. 1048576, or 0 for the default",
        c.offload_piece));
  }
  if (command == kTrainCommand && c.offload_dir.empty()) {
    throw InvalidArgument(
        "--offload-dir is empty; give a directory on a disk with room for the states, e.g. "
        "/var/tmp");
  }
  if (c.int8_moments && c.offload_piece % kOffloadAlign != 0) {
    throw InvalidArgument(fmt::format(
        "--offload-piece {} is not a multiple of 4096 elements, which --optimizer-states int8 "
        "needs with --offload (the file's one-byte codes fill O_DIRECT's 4 KiB block at 4096); "
        "use e.g. 1048576, or 0 for the default",
        c.offload_piece));
  }
}

// train's own: where checkpoints go and how long a signal waits for one, the schedule, the
// restarts and the processes.
void check_train_run(const TrainConfig& c) {
  if (c.checkpoint_dir.empty() && (c.checkpoint_every > 0 || c.keep > 0)) {
    throw InvalidArgument(fmt::format("{} {} needs --checkpoint-dir DIR to save into",
                                      c.checkpoint_every > 0 ? "--checkpoint-every" : "--keep",
                                      c.checkpoint_every > 0 ? c.checkpoint_every : c.keep));
  }
  // Ranks whose write finished wait for the others in a collective, which must outlast it.
  if (c.checkpoint_async && c.checkpoint_signal_wait >= c.launch.comm.timeout_seconds) {
    throw InvalidArgument(fmt::format(
        "--checkpoint-signal-wait {:g}s is not below --collective-timeout {:g}s: the ranks "
        "done writing wait for the rest in a collective; lower it, or raise "
        "--collective-timeout",
        c.checkpoint_signal_wait, c.launch.comm.timeout_seconds));
  }
  // --steps 0 runs no schedule at all.
  if (c.schedule == "cosine" && c.warmup >= c.steps && c.steps > 0) {
    throw InvalidArgument(fmt::format(
        "--warmup {} leaves no steps for the cosine decay of --steps {}; use fewer warmup steps",
        c.warmup, c.steps));
  }
  if (c.max_restarts > 0 && c.launch.backend != Backend::kLocal) {
    throw InvalidArgument(fmt::format(
        "--max-restarts {} works on the local backend only: under MPI a failed rank ends the "
        "job; relaunch it with mpirun -np N' zerodp train --backend mpi ... --checkpoint-dir DIR "
        "--resume latest, N' any rank count dividing the step's micro-batches (without "
        "--grad-accum the batch is kept)",
        c.max_restarts));
  }
  if (c.max_restarts > 0 && c.checkpoint_every == 0) {
    // --checkpoint-every without --checkpoint-dir is refused above.
    throw InvalidArgument(fmt::format(
        "--max-restarts {} needs checkpoints along the way to restart from; pass {}",
        c.max_restarts,
        c.checkpoint_dir.empty() ? "--checkpoint-dir DIR and --checkpoint-every K"
                                 : "--checkpoint-every K (a restart repeats at most K steps)"));
  }
  check_process_ranks(c.launch.ranks_per_process, c.launch.backend == Backend::kMpi,
                      c.launch.comm.node_ranks, /*processes=*/0);
}

}  // namespace

void check_run(const TrainConfig& c, Command command) {
  check_option_values(c, command);
  check_islands(c);
  check_order(c);
  check_hsdp(c);
  check_nodes(c);
  check_offload(c, command);
  if (command == kTrainCommand) check_train_run(c);
  check_idle_options(c, command);
}

void check_run_at_stages(const TrainConfig& c, std::span<const int> stages) {
  std::optional<InvalidArgument> refused;
  int refused_at = -1;
  for (const int stage : stages) {
    TrainConfig at = c;
    at.stage = stage;
    try {
      check_run(at, kEstimateCommand);
      return;
    } catch (const InvalidArgument& e) {
      if (stage > refused_at) {
        refused = e;
        refused_at = stage;
      }
    }
  }
  if (refused) throw *refused;
}

namespace {

// The first --inject at a rank outside a world of `world` ranks, or none.
const Injection* injected_outside(const TrainConfig& c, int world) {
  const auto i = std::find_if(c.inject.begin(), c.inject.end(),
                              [world](const Injection& j) { return j.rank >= world; });
  return i == c.inject.end() ? nullptr : &*i;
}

}  // namespace

void check_world(const TrainConfig& c, int world, WorldNamed named) {
  check_island_world(c, world, named);
  check_whole_nodes(c.launch.comm.node_ranks, world, named);
  if (const Injection* i = injected_outside(c, world)) {
    throw InvalidArgument(
        fmt::format("--inject at rank {}: the run has ranks 0..{}", i->rank, world - 1));
  }
}

// The rules without their words: the advice asks it of up to a million worlds.
bool launchable(const TrainConfig& c, int world) {
  return islands_fit_world(c, world) &&
         divides_world(c.launch.comm.node_ranks, world, /*zero_is_whole=*/true) &&
         injected_outside(c, world) == nullptr;
}

void resolve_world(TrainConfig& c, int world, WorldNamed named) {
  default_island_nodes(c, world);
  check_world(c, world, named);
}

}  // namespace zerodp
