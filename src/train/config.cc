// TrainConfig's parsers and names, and the rules about it the planner asks too (the islands'
// world, the fragments). config.h is the contract.
#include "train/config.h"

#include <charconv>
#include <cmath>

#include <fmt/core.h>

#include "comm/world_shape.h"
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

namespace {

// An island's ranks and the ranks per node it lies on, once --islands divides the world.
struct IslandNodes {
  int ranks, node;
};
IslandNodes island_nodes(const TrainConfig& c, int world) {
  const int n = c.islands_in_turn ? world : world / c.islands;
  return {n, c.launch.comm.node_ranks > 0 ? c.launch.comm.node_ranks : n};
}

}  // namespace

bool islands_fit_world(const TrainConfig& c, int world) {
  if (c.islands == 1) return true;
  if (!c.islands_in_turn && !divides_world(c.islands, world)) return false;
  const auto [n, t] = island_nodes(c, world);
  return n % t == 0 || t % n == 0;
}

void check_island_world(const TrainConfig& c, int world, WorldNamed named) {
  if (islands_fit_world(c, world)) return;
  if (!c.islands_in_turn) {
    check_divides_world("--islands", c.islands, world, "every island has as many ranks", named);
  }
  const auto [n, t] = island_nodes(c, world);
  throw InvalidArgument(fmt::format(
      "--islands {} of {} ranks each and --node-ranks {}: an island must be whole nodes or a "
      "part of one; use --node-ranks dividing {} or a multiple of it",
      c.islands, n, t, n));
}

void check_fragments(const TrainConfig& c, uint64_t params) {
  if (c.islands < 2 || static_cast<uint64_t>(c.fragments) <= params) return;
  throw InvalidArgument(fmt::format(
      "--fragments {} would split the model's {} parameters into fragments of less than one "
      "element; use at most {} (a divisor of --outer-every {}, e.g. 4)",
      c.fragments, params, params, c.outer_every));
}

}  // namespace zerodp
