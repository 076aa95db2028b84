// resolve_config, the rules between options and config_json: what turns the options given
// into the run's configuration and back. The table of options is options.cc; the parsers and
// the refusals train and estimate share are config.cc.
#include <algorithm>

#include <fmt/core.h>

#include "core/error.h"
#include "train/config.h"
#include "train/model_kind.h"
#include "train/options.h"
#include "train/plan.h"

namespace zerodp {

namespace {

// --islands: what DiLoCo's islands need of the other options. Islands are nodes unless
// --node-ranks says otherwise (then an island is whole nodes, or a part of one).
void check_islands(TrainConfig& c) {
  check_island_modes(c);
  if (c.islands == 1) return;
  const int k = c.islands;
  if (c.islands_in_turn) return;  // every island on all the ranks: any world, one node
  if (c.launch.backend == Backend::kLocal && c.launch.ranks % k != 0) {
    throw InvalidArgument(fmt::format(
        "--islands {} does not divide --ranks {}: every island has as many ranks; use a divisor "
        "of {}",
        k, c.launch.ranks, c.launch.ranks));
  }
  c.launch.islands = k;
  if (c.launch.backend == Backend::kLocal) {
    (void)island_layout(c, c.launch.ranks);  // islands that fit the nodes, or refused
    default_island_nodes(c, c.launch.ranks);
  }
}

}  // namespace

namespace {

// --optimizer-states int8's combinations, and the bound on an asynchronous save at a signal.
void resolve_states_and_saves(TrainConfig& c) {
  if (c.int8_moments && c.offload != Offload::kNone && c.offload_piece % kOffloadAlign != 0) {
    throw InvalidArgument(fmt::format(
        "--offload-piece {} is not a multiple of 4096 elements, which --optimizer-states int8 "
        "needs with --offload (the file's one-byte codes fill O_DIRECT's 4 KiB block at 4096); "
        "use e.g. 1048576, or 0 for the default",
        c.offload_piece));
  }
  // Ranks whose write finished wait for the others in a collective, which must outlast it:
  // the default gives way to a short --collective-timeout, a value given does not.
  const bool wait_given = c.given && c.given->count("checkpoint_signal_wait") > 0;
  if (!wait_given) {
    c.checkpoint_signal_wait =
        std::min(c.checkpoint_signal_wait, c.launch.comm.timeout_seconds / 2);
  }
  if (c.checkpoint_async && c.checkpoint_signal_wait >= c.launch.comm.timeout_seconds) {
    throw InvalidArgument(fmt::format(
        "--checkpoint-signal-wait {:g}s is not below --collective-timeout {:g}s: the ranks "
        "done writing wait for the rest in a collective; lower it, or raise "
        "--collective-timeout",
        c.checkpoint_signal_wait, c.launch.comm.timeout_seconds));
  }
}

}  // namespace

void resolve_config(TrainConfig& c) {
  model_kind(c.model).resolve(c);
  if (c.grad_accum == 0) c.grad_accum = 1;
  // Each option's own rule (options.cc); the rules between options follow.
  check_option_values(c);
  check_islands(c);
  if (c.accumulate_default) {
    c.accumulate = default_accumulate(c.stage, c.grad_accum, c.invariant);
    c.accumulate_default = false;
  }
  check_invariant_policy(c.invariant, c.accumulate);
  check_invariant_collectives(c.invariant, c.launch.comm);
  if (c.shard_within_node) {
    check_shard_within_node(c.stage, c.launch.comm.node_ranks, c.invariant, c.launch.comm.two_level,
                            c.hpz, c.qwz, c.launch.comm.qgz_bits);
  }
  check_offload_modes(c.offload, c.qwz, c.stage, c.offload_overlap);
  if (c.offload == Offload::kParams && c.precision != Precision::kFP32 &&
      c.offload_piece % 2048 != 0) {
    throw InvalidArgument(fmt::format(
        "--offload-piece {} is not a multiple of 2048 elements, which --offload "
        "optimizer,params needs (2-byte parameters fill O_DIRECT's 4 KiB block at 2048); use "
        "e.g. 1048576, or 0 for the default",
        c.offload_piece));
  }
  if (c.offload != Offload::kNone && c.offload_dir.empty()) {
    throw InvalidArgument(
        "--offload-dir is empty; give a directory on a disk with room for the states, e.g. "
        "/var/tmp");
  }
  if (c.checkpoint_dir.empty() && (c.checkpoint_every > 0 || c.keep > 0)) {
    throw InvalidArgument(fmt::format("{} {} needs --checkpoint-dir DIR to save into",
                                      c.checkpoint_every > 0 ? "--checkpoint-every" : "--keep",
                                      c.checkpoint_every > 0 ? c.checkpoint_every : c.keep));
  }
  resolve_states_and_saves(c);
  if (c.warmup == -1) c.warmup = c.schedule == "cosine" ? c.steps / 20 : 0;
  // --steps 0 runs no schedule at all.
  if (c.schedule == "cosine" && c.warmup >= c.steps && c.steps > 0) {
    throw InvalidArgument(fmt::format(
        "--warmup {} leaves no steps for the cosine decay of --steps {}; use fewer warmup steps",
        c.warmup, c.steps));
  }
  for (const Injection& i : c.inject) {
    if (c.launch.backend == Backend::kLocal && i.rank >= c.launch.ranks) {
      throw InvalidArgument(
          fmt::format("--inject at rank {}: the run has ranks 0..{}", i.rank, c.launch.ranks - 1));
    }
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
  if (c.launch.ranks_per_process > 1 && c.launch.backend == Backend::kLocal) {
    throw InvalidArgument(fmt::format(
        "--ranks-per-process {} is for --backend mpi; the local backend already runs every "
        "rank as a thread of one process (use --ranks)",
        c.launch.ranks_per_process));
  }
  if (c.launch.ranks_per_process > 1 && c.launch.comm.node_ranks > 0 &&
      c.launch.comm.node_ranks % c.launch.ranks_per_process != 0) {
    throw InvalidArgument(fmt::format(
        "--ranks-per-process {} does not divide --node-ranks {}: a process's ranks must share "
        "a node; use a divisor of {}",
        c.launch.ranks_per_process, c.launch.comm.node_ranks, c.launch.comm.node_ranks));
  }
  const int t = c.launch.comm.node_ranks;
  check_inter_node_link(c.launch.comm);
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
  check_node_modes(t, c.launch.comm.two_level, c.hpz, c.launch.comm.qgz_bits,
                   c.launch.comm.qgz_block, c.qwz_block);
  if (t > 0 && c.launch.backend == Backend::kLocal && c.launch.ranks % t != 0) {
    throw InvalidArgument(fmt::format(
        "--node-ranks {} does not divide --ranks {}: a world is whole nodes; use a divisor of "
        "{}",
        t, c.launch.ranks, c.launch.ranks));
  }
  check_idle_options(c);
}

namespace {

// An option that acts only in some combinations. `idle` says when it has nothing to do,
// `needs` what would give it something (it completes "...; NEEDS, or leave --FLAG out").
struct IdleRule {
  std::string_view key;  // config_json's
  bool (*idle)(const TrainConfig& c);
  std::string_view needs;
  std::string (*value)(const TrainConfig& c);
};

std::string on_off(bool v) { return v ? "on" : "off"; }
// The kinds the command line builds; a caller's kinds keep the fields they record.
bool not_transformer(const TrainConfig& c) { return c.model == "mlp"; }
bool not_mlp(const TrainConfig& c) { return c.model == "gpt" || c.model == "llama"; }
bool not_llama(const TrainConfig& c) { return c.model == "gpt" || c.model == "mlp"; }
bool no_offload(const TrainConfig& c) { return c.offload == Offload::kNone; }
bool no_islands(const TrainConfig& c) { return c.islands == 1; }
// Islands of one rank each: no gradient or parameter collective runs inside an island, so
// the options that shape them have nothing to act on.
bool one_rank_islands(const TrainConfig& c) {
  return c.islands > 1 && !c.islands_in_turn && c.launch.ranks == c.islands;
}
constexpr std::string_view kOneRankIslands =
    "the --islands have one rank each, so no collective runs inside one; use islands of two "
    "or more ranks (more --ranks or fewer --islands)";

// The one table of these rules: check_idle_options refuses what the user gave of them, and
// config_json writes null for each idle one.
const IdleRule kIdleRules[] = {
    {"qwz_block", [](const TrainConfig& c) { return !c.qwz; },
     "it sizes --qwz's blocks, and --qwz is off; add --qwz",
     [](const TrainConfig& c) { return std::to_string(c.qwz_block); }},
    {"qgz_block", [](const TrainConfig& c) { return c.launch.comm.qgz_bits == 0; },
     "it sizes --qgz's blocks, and --qgz is off; add --qgz int8 (or int4)",
     [](const TrainConfig& c) { return std::to_string(c.launch.comm.qgz_block); }},
    {"checkpoint_storage", [](const TrainConfig& c) { return c.checkpoint_dir.empty(); },
     "it says where --checkpoint-dir lives, and there is none; add --checkpoint-dir DIR",
     [](const TrainConfig& c) {
       return std::string(c.node_local_checkpoints ? "node-local" : "shared");
     }},
    {"offload_dir", no_offload,
     "it holds --offload's scratch files, and --offload is none; add "
     "--offload optimizer",
     [](const TrainConfig& c) { return c.offload_dir; }},
    {"offload_piece", no_offload,
     "it sizes --offload's staged pieces, and --offload is none; add "
     "--offload optimizer",
     [](const TrainConfig& c) { return std::to_string(c.offload_piece); }},
    {"offload_overlap", no_offload,
     "it overlaps --offload's update, and --offload is none; add "
     "--offload optimizer",
     [](const TrainConfig& c) { return on_off(c.offload_overlap); }},
    {"offload_overlap", [](const TrainConfig& c) { return c.stage == 1 || c.stage == 2; },
     "stages 1 and 2 gather the updated shards after the whole update, so no forward can start "
     "on a unit already updated; use --stage 0 or 3",
     [](const TrainConfig& c) { return on_off(c.offload_overlap); }},
    {"prefetch", [](const TrainConfig& c) { return c.stage != 3; },
     "it sets how many units stage 3 gathers ahead, and stages 0-2 gather none; use --stage 3",
     [](const TrainConfig& c) { return std::to_string(c.prefetch); }},
    {"initial_loss_scale", [](const TrainConfig& c) { return c.precision != Precision::kFP16; },
     "only fp16 scales its loss; use --precision fp16",
     [](const TrainConfig& c) { return fmt::format("{:g}", c.initial_loss_scale); }},
    {"checkpoint_async", [](const TrainConfig& c) { return c.checkpoint_dir.empty(); },
     "it writes checkpoints in the background; add --checkpoint-dir DIR",
     [](const TrainConfig& c) { return on_off(c.checkpoint_async); }},
    {"checkpoint_busy", [](const TrainConfig& c) { return !c.checkpoint_async; },
     "it says what a save due during an asynchronous one does; add --checkpoint-async",
     [](const TrainConfig& c) { return std::string(c.checkpoint_skip_busy ? "skip" : "wait"); }},
    {"checkpoint_signal_wait", [](const TrainConfig& c) { return !c.checkpoint_async; },
     "it bounds the wait for an asynchronous save on a signal; add --checkpoint-async",
     [](const TrainConfig& c) { return fmt::format("{:g}", c.checkpoint_signal_wait); }},
    {"qgz", [](const TrainConfig& c) { return one_rank_islands(c) && c.launch.comm.qgz_bits != 0; },
     kOneRankIslands,
     [](const TrainConfig& c) { return std::string(qgz_name(c.launch.comm.qgz_bits)); }},
    {"hpz", [](const TrainConfig& c) { return one_rank_islands(c) && c.hpz; }, kOneRankIslands,
     [](const TrainConfig& c) { return on_off(c.hpz); }},
    {"collectives",
     [](const TrainConfig& c) { return one_rank_islands(c) && c.launch.comm.two_level; },
     kOneRankIslands,
     [](const TrainConfig& c) { return std::string(collectives_name(c.launch.comm.two_level)); }},
    {"outer_every", no_islands, "it spaces DiLoCo's outer steps; add --islands K",
     [](const TrainConfig& c) { return std::to_string(c.outer_every); }},
    {"outer_lr", no_islands, "it sizes DiLoCo's outer step; add --islands K",
     [](const TrainConfig& c) { return fmt::format("{:g}", c.outer_lr); }},
    {"outer_momentum", no_islands, "it is DiLoCo's outer momentum; add --islands K",
     [](const TrainConfig& c) { return fmt::format("{:g}", c.outer_momentum); }},
    {"fragments", no_islands, "it streams DiLoCo's outer steps; add --islands K",
     [](const TrainConfig& c) { return std::to_string(c.fragments); }},
    {"outer_delay", no_islands, "it delays DiLoCo's merges; add --islands K",
     [](const TrainConfig& c) { return std::to_string(c.outer_delay); }},
    {"outer_quant", no_islands, "it quantizes DiLoCo's outer gradients; add --islands K",
     [](const TrainConfig& c) { return std::string(qgz_name(c.outer_quant)); }},
    {"outer_mix", [](const TrainConfig& c) { return c.islands == 1 || c.outer_delay == 0; },
     "it weighs a delayed merge, and merges wait for their exchange; add --islands K and "
     "--outer-delay D",
     [](const TrainConfig& c) { return fmt::format("{:g}", c.outer_mix); }},
    {"size", not_transformer, "it picks a gpt or llama preset; use --model gpt or llama",
     [](const TrainConfig& c) { return c.size; }},
    {"layers", not_transformer, "it shapes a gpt or a llama; use --model gpt or llama",
     [](const TrainConfig& c) { return std::to_string(c.layers); }},
    {"heads", not_transformer, "it shapes a gpt or a llama; use --model gpt or llama",
     [](const TrainConfig& c) { return std::to_string(c.heads); }},
    {"embd", not_transformer, "it shapes a gpt or a llama; use --model gpt or llama",
     [](const TrainConfig& c) { return std::to_string(c.embd); }},
    {"seq_len", not_transformer, "it shapes a gpt or a llama; use --model gpt or llama",
     [](const TrainConfig& c) { return std::to_string(c.seq_len); }},
    {"vocab", not_transformer, "it shapes a gpt or a llama; use --model gpt or llama",
     [](const TrainConfig& c) { return std::to_string(c.vocab); }},
    {"kv_heads", not_llama, "it shapes a llama; use --model llama",
     [](const TrainConfig& c) { return std::to_string(c.kv_heads); }},
    {"ffn_hidden", not_llama, "it shapes a llama; use --model llama",
     [](const TrainConfig& c) { return std::to_string(c.ffn_hidden); }},
    {"rope_theta", not_llama, "it shapes a llama; use --model llama",
     [](const TrainConfig& c) { return std::to_string(c.rope_theta); }},
    {"norm_eps", not_llama, "it shapes a llama; use --model llama",
     [](const TrainConfig& c) { return fmt::format("{:g}", c.norm_eps); }},
    {"mlp_hidden", not_mlp, "it shapes an mlp; use --model mlp",
     [](const TrainConfig& c) { return std::to_string(c.mlp_hidden); }},
    {"mlp_layers", not_mlp, "it shapes an mlp; use --model mlp",
     [](const TrainConfig& c) { return std::to_string(c.mlp_layers); }},
};

// Refuses the first rule of `kIdleRules` that `applies` to, was given and has nothing to do.
void refuse_idle(const TrainConfig& c, const std::set<std::string>& given,
                 bool (*applies)(const IdleRule&)) {
  for (const IdleRule& rule : kIdleRules) {
    if (!applies(rule) || given.count(std::string(rule.key)) == 0 || !rule.idle(c)) continue;
    const std::string flag = flag_of(rule.key);
    throw InvalidArgument(fmt::format("{} {} does nothing here: {}, or leave {} out", flag,
                                      rule.value(c), rule.needs, flag));
  }
}

}  // namespace

void check_idle_island_options(const TrainConfig& c, const std::set<std::string>& given) {
  refuse_idle(c, given,
              [](const IdleRule& r) { return r.idle == no_islands || r.key == "outer_mix"; });
}

void check_idle_options(const TrainConfig& c) {
  if (!c.given) return;
  refuse_idle(c, *c.given, [](const IdleRule&) { return true; });
  // 0 would mean "one node", which leaving the flag out already says; -2 is refused in
  // resolve_config.
  if (c.given->count("node_ranks") != 0 && c.launch.comm.node_ranks == 0) {
    throw InvalidArgument(
        "--node-ranks 0 is invalid; use the ranks per node (1 or more), or leave it out for one "
        "node");
  }
}

nlohmann::json config_json(const TrainConfig& c) {
  nlohmann::json j;
  model_kind(c.model).config_fields(c, j);
  for (const OptionSpec& o : option_table()) {
    if (o.record != nullptr) j[std::string(o.key)] = o.record(c);
  }
  // The engine's fixed choice, recorded with the options it completes.
  j["min_lr_ratio"] = c.min_lr_ratio;
  for (const IdleRule& rule : kIdleRules) {
    const std::string key(rule.key);
    if (j.contains(key) && rule.idle(c)) j[key] = nullptr;
  }
  return j;
}

}  // namespace zerodp
