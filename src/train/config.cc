// Parsing and resolving TrainConfig, and its JSON form (the report's "config", the
// cross-rank comparison, a --config file). config.h is the contract.
#include "train/config.h"

#include <charconv>
#include <cmath>

#include <fmt/core.h>

#include "core/error.h"

namespace zerodp {

Sharding Sharding::for_stage(int stage) {
  if (stage < 0 || stage > 3) {
    throw InvalidArgument(fmt::format("--stage {} is not a ZeRO stage; use 0, 1, 2 or 3", stage));
  }
  return {.optimizer_states = stage >= 1, .gradients = stage >= 2, .parameters = stage >= 3};
}

std::optional<Precision> parse_precision(std::string_view name) {
  if (name == "bf16") return Precision::kBF16;
  if (name == "fp16") return Precision::kFP16;
  if (name == "fp32") return Precision::kFP32;
  return std::nullopt;
}

Precision parse_precision_flag(std::string_view text, std::string_view flag) {
  if (const auto p = parse_precision(text)) return *p;
  throw InvalidArgument(fmt::format("{} '{}' is unknown; use bf16, fp16 or fp32", flag, text));
}

std::string_view precision_name(Precision p) {
  switch (p) {
    case Precision::kBF16:
      return "bf16";
    case Precision::kFP16:
      return "fp16";
    case Precision::kFP32:
      return "fp32";
  }
  return "unknown";
}

std::optional<AccumulatePolicy> parse_accumulate(std::string_view name) {
  if (name == "local") return AccumulatePolicy::kLocal;
  if (name == "reduce") return AccumulatePolicy::kReduce;
  return std::nullopt;
}

AccumulatePolicy parse_accumulate_flag(std::string_view text, std::string_view flag) {
  if (const auto p = parse_accumulate(text)) return *p;
  throw InvalidArgument(fmt::format("{} '{}' is unknown; use local or reduce", flag, text));
}

std::string_view accumulate_name(AccumulatePolicy p) {
  return p == AccumulatePolicy::kLocal ? "local" : "reduce";
}

AccumulatePolicy default_accumulate(int stage, int grad_accum, std::optional<bool> invariant) {
  return invariant.value_or(false) || stage >= 2 || grad_accum == 1 ? AccumulatePolicy::kReduce
                                                                    : AccumulatePolicy::kLocal;
}

std::optional<bool> parse_invariant_flag(std::string_view text) {
  if (text == "on" || text == "true") return true;
  if (text == "off" || text == "false") return false;
  if (text == "auto") return std::nullopt;
  throw InvalidArgument(fmt::format("--invariant '{}' is unknown; use on, off or auto", text));
}

bool parse_collectives_flag(std::string_view text) {
  if (text == "flat") return false;
  if (text == "two-level") return true;
  throw InvalidArgument(fmt::format(
      "--collectives '{}' is unknown; use flat (every rank with every rank) or two-level "
      "(inside each node, then across nodes; needs --node-ranks)",
      text));
}

std::string_view collectives_name(bool two_level) { return two_level ? "two-level" : "flat"; }

int parse_qgz_flag(std::string_view text) {
  if (text == "off") return 0;
  if (text == "int8") return 8;
  if (text == "int4") return 4;
  throw InvalidArgument(fmt::format(
      "--qgz '{}' is unknown; use int8 or int4 (gradients reduced in quantized blocks), or off",
      text));
}

std::string_view qgz_name(int bits) { return bits == 8 ? "int8" : bits == 4 ? "int4" : "off"; }

void check_invariant_collectives(std::optional<bool> invariant, const CommOptions& comm) {
  if (invariant.value_or(false) && comm.qgz_bits != 0) {
    throw InvalidArgument(
        "--invariant on needs unquantized gradients: --qgz rounds each node's partial to "
        "blocks, so the sum depends on the ranks per node (docs/determinism.md)");
  }
  if (invariant.value_or(false) && comm.two_level) {
    throw InvalidArgument(
        "--invariant on needs --collectives flat: two-level collectives add each node's ranks "
        "first and round that partial, so the sum depends on the ranks per node "
        "(docs/determinism.md)");
  }
}

void check_node_modes(int node_ranks, bool two_level, bool hpz, int qgz_bits, size_t qgz_block,
                      int qwz_block) {
  if (qgz_bits != 0 && qgz_block < 1) {
    throw InvalidArgument(fmt::format(
        "--qgz-block {} is invalid; use the elements per scale, 1 or more (default 256)",
        qgz_block));
  }
  if (qwz_block < 1) {
    throw InvalidArgument(fmt::format(
        "--qwz-block {} is invalid; use the elements per scale, 1 or more (default 4096)",
        qwz_block));
  }
  if (hpz && node_ranks == 0) {
    throw InvalidArgument(
        "--hpz shards a second copy of the parameters within each node; it needs --node-ranks T "
        "to say which ranks share a node");
  }
  if (two_level && node_ranks == 0) {
    throw InvalidArgument(
        "--collectives two-level needs --node-ranks T to say which ranks share a node");
  }
}

void check_inter_node_link(const CommOptions& comm) {
  if (comm.node_ranks == 0 && (comm.inter_node_bandwidth > 0 || comm.inter_node_latency > 0)) {
    throw InvalidArgument(fmt::format(
        "{} needs --node-ranks T to say which ranks share a node",
        comm.inter_node_bandwidth > 0 ? "--inter-node-bandwidth" : "--inter-node-latency"));
  }
}

void check_shard_within_node(int stage, int node_ranks, std::optional<bool> invariant,
                             bool two_level, bool hpz, bool qwz, int qgz_bits) {
  if (node_ranks == 0) {
    throw InvalidArgument(
        "--shard-within-node shards the states over the ranks of each node; it needs "
        "--node-ranks T to say which ranks share a node");
  }
  if (stage == 0) {
    throw InvalidArgument(
        "--shard-within-node shards states inside each node; --stage 0 shards none. Use "
        "--stage 1, 2 or 3");
  }
  const char* other = hpz             ? "--hpz"
                      : qwz           ? "--qwz"
                      : qgz_bits != 0 ? "--qgz"
                      : two_level     ? "--collectives two-level"
                                      : nullptr;
  if (other != nullptr) {
    throw InvalidArgument(fmt::format(
        "--shard-within-node already gathers inside each node and reduces in two levels; "
        "{} has nothing to act on with it. Leave {} out",
        other, other));
  }
  if (invariant.value_or(false)) {
    throw InvalidArgument(
        "--invariant on needs one order for every rank count, but --shard-within-node adds "
        "each node's ranks first and rounds that partial (docs/determinism.md); use "
        "--invariant auto or off");
  }
}

void check_invariant_policy(std::optional<bool> invariant, AccumulatePolicy policy) {
  if (invariant.value_or(false) && policy == AccumulatePolicy::kLocal) {
    throw InvalidArgument(
        "--invariant on needs --accumulate reduce: a local sum adds a rank's own micro-batches "
        "before the ranks' sums meet, in an order that depends on the rank count");
  }
}

Injection parse_injection(std::string_view text) {
  const auto bad = [&](std::string_view why) {
    return InvalidArgument(fmt::format(
        "--inject '{}': {}; use KIND@STEP[:RANK] with KIND throw, hang, kill, nan, io, slowio, "
        "commitio, slowcommit, oom or term, e.g. nan@3:1",
        text, why));
  };
  const size_t at = text.find('@');
  if (at == std::string_view::npos) throw bad("no @STEP");
  const std::string_view kind = text.substr(0, at);
  Injection inj;
  if (kind == "throw") {
    inj.kind = Injection::Kind::kThrow;
  } else if (kind == "hang") {
    inj.kind = Injection::Kind::kHang;
  } else if (kind == "kill") {
    inj.kind = Injection::Kind::kKill;
  } else if (kind == "nan") {
    inj.kind = Injection::Kind::kNan;
  } else if (kind == "io") {
    inj.kind = Injection::Kind::kIo;
  } else if (kind == "slowio") {
    inj.kind = Injection::Kind::kSlowIo;
  } else if (kind == "commitio") {
    inj.kind = Injection::Kind::kCommitIo;
  } else if (kind == "slowcommit") {
    inj.kind = Injection::Kind::kSlowCommit;
  } else if (kind == "oom") {
    inj.kind = Injection::Kind::kOom;
  } else if (kind == "term") {
    inj.kind = Injection::Kind::kTerm;
  } else {
    throw bad(fmt::format("unknown kind '{}'", kind));
  }
  const std::string_view rest = text.substr(at + 1);
  const size_t colon = rest.find(':');
  const auto number = [&](std::string_view digits, std::string_view what) {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (ec != std::errc() || end != digits.data() + digits.size() || digits.empty() || v < 0) {
      throw bad(fmt::format("{} '{}' is not a non-negative integer", what, digits));
    }
    return v;
  };
  inj.step = number(rest.substr(0, colon), "STEP");
  if (inj.step < 1) throw bad("STEP counts from 1");
  if (colon != std::string_view::npos) {
    inj.rank = static_cast<int>(number(rest.substr(colon + 1), "RANK"));
  }
  return inj;
}

Offload parse_offload(std::string_view text) {
  if (text == "none") return Offload::kNone;
  if (text == "optimizer") return Offload::kOptimizer;
  if (text == "optimizer,params" || text == "params,optimizer") return Offload::kParams;
  if (text == "params") {
    throw InvalidArgument(
        "--offload params: the parameters go to disk only with the optimizer's states, which "
        "are 6 times their bytes; use --offload optimizer,params");
  }
  throw InvalidArgument(
      fmt::format("--offload '{}' is not a tier; use none, optimizer or optimizer,params", text));
}

std::string_view offload_name(Offload o) {
  switch (o) {
    case Offload::kNone:
      return "none";
    case Offload::kOptimizer:
      return "optimizer";
    case Offload::kParams:
      return "optimizer,params";
  }
  return "none";
}

void check_offload_modes(Offload offload, bool qwz, int stage, bool overlap) {
  if (offload != Offload::kNone && qwz) {
    throw InvalidArgument(fmt::format(
        "--qwz quantizes parameters from the fp32 master, which --offload {} keeps on disk; use "
        "one of the two",
        offload_name(offload)));
  }
  if (offload != Offload::kParams) return;
  if (stage != 3) {
    throw InvalidArgument(fmt::format(
        "--offload optimizer,params puts each rank's parameter shard on disk, and only stage 3 "
        "shards parameters (at stage {} every rank computes on its full copy); use --stage 3, "
        "or --offload optimizer",
        stage));
  }
  if (overlap) {
    throw InvalidArgument(
        "--offload-overlap on with --offload optimizer,params: the next forward would read "
        "parameter shards the update is still writing; use --offload-overlap off, or "
        "--offload optimizer");
  }
}

bool canonical_order(const TrainConfig& c) {
  return c.invariant.value_or(c.accumulate == AccumulatePolicy::kReduce &&
                              !c.launch.comm.two_level && c.launch.comm.qgz_bits == 0 &&
                              !c.shard_within_node);
}

bool fp32_accumulator(const TrainConfig& c) { return canonical_order(c) && c.grad_accum > 1; }

std::string flag_of(std::string_view key) {
  std::string flag = "--" + std::string(key);
  for (char& ch : flag) ch = ch == '_' ? '-' : ch;
  return flag;
}

void default_island_nodes(TrainConfig& c, int world) {
  if (c.islands > 1 && !c.islands_in_turn && c.launch.comm.node_ranks == 0 &&
      world % c.islands == 0) {
    c.launch.comm.node_ranks = world / c.islands;
  }
}

// What islands in turn do not do yet, each refused naming why.
void check_islands_in_turn(const TrainConfig& c) {
  if (!c.islands_in_turn) return;
  if (c.islands < 2) {
    throw InvalidArgument(fmt::format(
        "--islands-in-turn runs several islands on the same ranks; --islands {} is not several. "
        "Use --islands 2 or more",
        c.islands));
  }
  const auto refuse = [](std::string_view flag, std::string_view why) {
    throw InvalidArgument(
        fmt::format("--islands-in-turn cannot be combined with {} yet: {}", flag, why));
  };
  if (c.checkpoint_async && c.offload != Offload::kNone) {
    refuse("--checkpoint-async with --offload",
           "the background writer reads one island's offload file while the next step "
           "rewrites it; save synchronously, or keep the states in memory");
  }
}

void check_fragments(const TrainConfig& c, uint64_t params) {
  if (c.islands < 2 || static_cast<uint64_t>(c.fragments) <= params) return;
  throw InvalidArgument(fmt::format(
      "--fragments {} would split the model's {} parameters into fragments of less than one "
      "element; use at most {} (a divisor of --outer-every {}, e.g. 4)",
      c.fragments, params, params, c.outer_every));
}

void check_island_modes(const TrainConfig& c) {
  check_islands_in_turn(c);
  if (c.islands == 1) return;
  const int k = c.islands;
  const auto refuse = [k](std::string_view flag, std::string_view why) {
    throw InvalidArgument(fmt::format("--islands {} cannot be combined with {}: {}", k, flag, why));
  };
  if (c.shard_within_node) {
    refuse("--shard-within-node",
           "the islands already hold a replica each; shard inside each island with --stage");
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

}  // namespace zerodp
