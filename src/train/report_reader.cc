#include "train/report_reader.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <iterator>
#include <utility>

#include <fmt/core.h>

#include "comm/ledger.h"
#include "core/error.h"
#include "train/report.h"

namespace zerodp {
namespace {

using nlohmann::json;
namespace key = report_key;

constexpr int kLastStateCategory = static_cast<int>(MemCategory::kAdamV);
// config_json's keys for --node-ranks, --steps and --stop-after (train/config.h).
constexpr char kNodeRanks[] = "node_ranks";
constexpr char kConfigSteps[] = "steps";
constexpr char kConfigStopAfter[] = "stop_after";
constexpr char kIslands[] = "islands";
constexpr char kIslandsInTurn[] = "islands_in_turn";
constexpr char kShardWithinNode[] = "shard_within_node";

std::string category(int k) { return std::string(mem_category_name(static_cast<MemCategory>(k))); }

// `what` is "report" or "metrics": every message starts "<what> '<path>'".
std::string read_text(const std::string& what, const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw IoError(fmt::format("{} '{}': cannot be opened for reading", what, path));
  std::string text{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  if (f.bad()) throw IoError(fmt::format("{} '{}': reading failed", what, path));
  return text;
}

// nlohmann's messages start with "[json.exception.parse_error.101] "; the rest says where.
std::string parse_message(const json::parse_error& e) {
  std::string m = e.what();
  const auto p = m.find("] ");
  return p == std::string::npos ? m : m.substr(p + 2);
}

bool looks_like_step(const json& j) {
  return j.is_object() && j.contains(key::kStep) && j.contains(key::kLoss) &&
         !j.contains(key::kRanks);
}

// Says that the key at a path is wrong, and how; never returns.
using Refuse = std::function<void(const std::string& path, const std::string& what)>;

// Reads a report's keys; every refusal names the file and the key's path in the report.
class Fields {
 public:
  explicit Fields(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void bad(const std::string& path, const std::string& what) const {
    throw InvalidArgument(
        fmt::format("report '{}' is not a zerodp train report: '{}' {}", file_, path, what));
  }
  Refuse refuse() const {
    return [this](const std::string& path, const std::string& what) { bad(path, what); };
  }
  const json& at(const json& obj, const std::string& path, const char* k) const {
    if (!obj.is_object() || !obj.contains(k)) bad(join(path, k), "is missing");
    return obj.at(k);
  }
  const json& object(const json& obj, const std::string& path, const char* k) const {
    const json& v = at(obj, path, k);
    if (!v.is_object()) bad(join(path, k), "is not an object");
    return v;
  }
  const json& array(const json& obj, const std::string& path, const char* k) const {
    const json& v = at(obj, path, k);
    if (!v.is_array()) bad(join(path, k), "is not an array");
    return v;
  }
  double number(const json& obj, const std::string& path, const char* k) const {
    const json& v = at(obj, path, k);
    if (!v.is_number()) bad(join(path, k), "is not a number");
    return v.get<double>();
  }
  // JSON null stands for a missing or non-finite value (the writer's convention).
  std::optional<double> number_or_null(const json& obj, const std::string& path,
                                       const char* k) const {
    if (!obj.contains(k) || obj.at(k).is_null()) return std::nullopt;
    return number(obj, path, k);
  }
  uint64_t count(const json& obj, const std::string& path, const char* k) const {
    const json& v = at(obj, path, k);
    // The parser reads every non-negative integer as unsigned; the writer's own JSON, not
    // yet through text, holds ints.
    const bool ok = v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
    if (!ok) bad(join(path, k), "is not a non-negative integer");
    return v.get<uint64_t>();
  }
  std::string string(const json& obj, const std::string& path, const char* k) const {
    const json& v = at(obj, path, k);
    if (!v.is_string()) bad(join(path, k), "is not a string");
    return v.get<std::string>();
  }

 private:
  static std::string join(const std::string& path, const char* k) {
    return path.empty() ? std::string(k) : path + "." + k;
  }
  std::string file_;
};

// Keys the page only shows: anything else reads as nothing.
std::optional<std::string> string_if_any(const json& obj, const char* k) {
  if (!obj.contains(k) || !obj.at(k).is_string()) return std::nullopt;
  return obj.at(k).get<std::string>();
}

// The same for counts: a number that is not a non-negative integer reads as nothing.
std::optional<uint64_t> count_if_any(const json& obj, const char* k) {
  if (!obj.contains(k)) return std::nullopt;
  const json& v = obj.at(k);
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<uint64_t>();
  return std::nullopt;
}

bool true_if_any(const json& obj, const char* k) {
  return obj.contains(k) && obj.at(k).is_boolean() && obj.at(k).get<bool>();
}

// The ranks the planner shards a unit's states over, from the options that decide it. The
// page divides the ZeRO formula by them, so `config.islands` is checked: a positive integer
// (null or missing: 1) that divides world_size unless the islands take turns on the ranks.
int read_shard_ranks(const Fields& F, const json& c, RunReport& r) {
  TrainConfig t;
  if (c.contains(kIslands) && !c[kIslands].is_null()) {
    const auto k = count_if_any(c, kIslands);
    const std::string at = fmt::format("{}.{}", key::kConfig, kIslands);
    if (!k || *k < 1) {
      F.bad(at, fmt::format("is {}; expected a positive integer or null", c[kIslands].dump()));
    }
    t.islands_in_turn = true_if_any(c, kIslandsInTurn);
    if (!t.islands_in_turn && static_cast<uint64_t>(r.world_size) % *k != 0) {
      F.bad(at, fmt::format("is {}, which does not divide world_size {}", *k, r.world_size));
    }
    r.islands = *k;
    t.islands = static_cast<int>(std::min<uint64_t>(*k, 1u << 20));
  }
  t.shard_within_node = true_if_any(c, kShardWithinNode);
  if (r.node_ranks) {
    t.launch.comm.node_ranks = static_cast<int>(std::min<uint64_t>(*r.node_ranks, 1u << 20));
  }
  return shard_ranks(t, r.world_size);
}

// `at` is the element's path ("steps[3]"); a --metrics line's is "[0]", which the caller's
// message drops.
ReportStep read_step(const json& s, const std::string& at, const Refuse& bad) {
  if (!s.is_object()) bad(at, "is not an object");
  if (!s.contains(key::kStep) || !s[key::kStep].is_number()) {
    bad(at + "." + key::kStep, "is missing or not a number");
  }
  if (!s.contains(key::kLoss) || !(s[key::kLoss].is_number() || s[key::kLoss].is_null())) {
    bad(at + "." + key::kLoss, "is missing or not a number");
  }
  ReportStep out;
  out.step = s[key::kStep].get<double>();
  if (!s[key::kLoss].is_null()) out.loss = s[key::kLoss].get<double>();
  if (s.contains(key::kValLoss)) {
    const json& v = s[key::kValLoss];
    if (!(v.is_number() || v.is_null())) bad(at + "." + key::kValLoss, "is not a number");
    out.evaluated = true;
    if (!v.is_null()) out.val_loss = v.get<double>();
  }
  if (s.contains(key::kOuter)) {
    if (!s[key::kOuter].is_boolean()) bad(at + "." + key::kOuter, "is not true or false");
    out.outer = s[key::kOuter].get<bool>();
  }
  return out;
}

std::vector<ReportStep> read_steps(const json& steps, const std::string& where, const Refuse& bad) {
  std::vector<ReportStep> out;
  out.reserve(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    out.push_back(read_step(steps[i], fmt::format("{}[{}]", where, i), bad));
  }
  return out;
}

ReportRank read_rank(const Fields& F, const json& rk, const std::string& where) {
  if (!rk.is_object()) F.bad(where, "is not an object");
  ReportRank r;
  r.rank = F.count(rk, where, key::kRank);
  const json& states = F.object(rk, where, key::kModelStateBytes);
  const json& peaks = F.object(rk, where, key::kPeakBytes);
  const std::string states_at = where + "." + key::kModelStateBytes;
  const std::string peaks_at = where + "." + key::kPeakBytes;
  for (int k = 0; k <= kLastStateCategory; ++k) {
    r.model_state[k] = F.count(states, states_at, category(k).c_str());
  }
  for (int k = kLastStateCategory + 1; k < kNumMemCategories; ++k) {
    // Reports written before the canonical order's accumulator, hpZ, offload, islands or
    // asynchronous saves existed have no grad_accum, hpz_params, offload_staging,
    // outer_state or checkpoint_staging.
    if ((k == static_cast<int>(MemCategory::kGradAccum) ||
         k == static_cast<int>(MemCategory::kHpzParams) ||
         k == static_cast<int>(MemCategory::kOffloadStaging) ||
         k == static_cast<int>(MemCategory::kOuterState) ||
         k == static_cast<int>(MemCategory::kCheckpointStaging)) &&
        !peaks.contains(category(k))) {
      continue;
    }
    r.peak[k] = F.count(peaks, peaks_at, category(k).c_str());
  }
  r.peak_total = F.count(peaks, peaks_at, key::kTotal);
  if (rk.contains(key::kNvmeBytes)) r.nvme_bytes = F.count(rk, where, key::kNvmeBytes);
  const json& comm = F.object(rk, where, key::kComm);
  for (const auto& [kind, v] : comm.items()) {
    const std::string at = fmt::format("{}.{}.{}", where, key::kComm, kind);
    const uint64_t bytes = F.count(v, at, key::kBytes);
    r.comm_bytes[kind] = bytes;
    // Reports written before nodes existed have no cross_node_bytes.
    if (!v.contains(key::kCrossNodeBytes)) continue;
    const uint64_t cross = F.count(v, at, key::kCrossNodeBytes);
    if (cross > bytes) {
      F.bad(fmt::format("{}.{}", at, key::kCrossNodeBytes),
            fmt::format("is {}, more than the {} bytes it is part of", cross, bytes));
    }
    r.comm_cross_node_bytes[kind] = cross;
  }
  return r;
}

ReportPlanRank read_plan_rank(const Fields& F, const json& states, const json& comm,
                              const json* outer, size_t i) {
  const std::string states_at = fmt::format("{}.{}[{}]", key::kPlan, key::kModelStateBytes, i);
  ReportPlanRank p;
  uint64_t* const fields[] = {&p.model_state.params, &p.model_state.grads, &p.model_state.master,
                              &p.model_state.adam_m, &p.model_state.adam_v};
  for (int k = 0; k <= kLastStateCategory; ++k) {
    *fields[k] = F.count(states, states_at, category(k).c_str());
  }
  p.model_state_total = F.count(states, states_at, key::kTotal);
  const std::string comm_at = fmt::format("{}.{}[{}]", key::kPlan, key::kCommBytesPerStep, i);
  p.comm_bytes_per_step = F.count(comm, comm_at, key::kTotal);
  // A plan written before it counted the bytes crossing nodes has no cross_node_bytes.
  if (comm.contains(key::kCrossNodeBytes)) {
    p.comm_cross_node_bytes_per_step = F.count(comm, comm_at, key::kCrossNodeBytes);
  }
  if (outer != nullptr) {
    const std::string outer_at = fmt::format("{}.{}[{}]", key::kPlan, key::kCommBytesOuterSteps, i);
    p.comm_bytes_outer_steps = F.count(*outer, outer_at, key::kTotal);
    p.comm_cross_node_bytes_outer_steps = F.count(*outer, outer_at, key::kCrossNodeBytes);
  }
  return p;
}

ReportRestart read_restart(const Fields& F, const json& x, const std::string& where) {
  if (!x.is_object()) F.bad(where, "is not an object");
  ReportRestart r;
  r.failed_step = F.count(x, where, key::kFailedStep);
  if (!F.at(x, where, key::kFailedRank).is_null()) {
    r.failed_rank = F.count(x, where, key::kFailedRank);
  }
  r.cause = F.string(x, where, key::kCause);
  r.ranks_before = F.count(x, where, key::kRanksBefore);
  r.ranks_after = F.count(x, where, key::kRanksAfter);
  r.resumed_step = F.count(x, where, key::kResumedStep);
  // Reports before it say nothing of the order: as if kept.
  r.order_note = string_if_any(x, key::kOrderNote).value_or("");
  return r;
}

// The page says how the run ended from these, so they are checked; `reason` may be one a
// later writer adds.
ReportStop read_stop(const Fields& F, const json& x) {
  const std::string where = key::kStopped;
  ReportStop s;
  s.reason = F.string(x, where, key::kReason);
  if (!F.at(x, where, key::kSignal).is_null()) s.signal = F.string(x, where, key::kSignal);
  s.after_step = F.count(x, where, key::kAfterStep);
  s.message = F.string(x, where, key::kMessage);
  return s;
}

// What the report's config says that the page needs (config_json's keys, train/config.h):
// the model, the ranks per node, the planned steps and the ranks a shard spans.
void read_config(const Fields& F, const json& root, RunReport& r) {
  if (root.contains(key::kConfig) && root[key::kConfig].is_object()) {
    const json& c = root[key::kConfig];
    r.model = ReportModel{string_if_any(c, "model").value_or(""), string_if_any(c, "size")};
    // Decides whether the page draws the bytes crossing nodes, so it is checked; reports
    // written before nodes existed have no node_ranks, and null means one node.
    if (c.contains(kNodeRanks) && !c[kNodeRanks].is_null()) {
      const std::string at = fmt::format("{}.{}", key::kConfig, kNodeRanks);
      const json& t = c[kNodeRanks];
      const bool ok = t.is_number_unsigned() ? t.get<uint64_t>() >= 1
                                             : t.is_number_integer() && t.get<int64_t>() >= 1;
      if (!ok) {
        F.bad(at,
              fmt::format("is {}; expected a positive integer (ranks per node) or null", t.dump()));
      }
      r.node_ranks = t.get<uint64_t>();
    }
    r.planned_steps = count_if_any(c, kConfigSteps);
    r.stop_after = count_if_any(c, kConfigStopAfter);
    r.shard_ranks = read_shard_ranks(F, c, r);
  } else {
    r.shard_ranks = r.world_size;
  }
}

// Each rank's figures, and the plan's per rank beside them when the report has a plan.
void read_ranks(const Fields& F, const json& root, RunReport& r) {
  const size_t world_size = static_cast<size_t>(r.world_size);
  // The plan is newer than the report format; older reports simply lack it.
  const json* plan_states = nullptr;
  const json* plan_comm = nullptr;
  const json* plan_outer = nullptr;  // --islands only; reports before it lack it
  if (root.contains(key::kPlan)) {
    const json& plan = F.object(root, "", key::kPlan);
    plan_states = &F.array(plan, key::kPlan, key::kModelStateBytes);
    plan_comm = &F.array(plan, key::kPlan, key::kCommBytesPerStep);
    if (plan.contains(key::kCommBytesOuterSteps)) {
      plan_outer = &F.array(plan, key::kPlan, key::kCommBytesOuterSteps);
    }
    if (plan_states->size() != world_size || plan_comm->size() != world_size ||
        (plan_outer != nullptr && plan_outer->size() != world_size)) {
      F.bad(key::kPlan,
            fmt::format("does not have one entry per rank (world_size {})", world_size));
    }
  }
  const json& ranks = F.array(root, "", key::kRanks);
  if (ranks.size() != world_size) {
    F.bad(key::kRanks, fmt::format("has {} entries for world_size {}", ranks.size(), world_size));
  }
  if (plan_states != nullptr) r.plan.emplace();
  for (size_t i = 0; i < ranks.size(); ++i) {
    r.ranks.push_back(read_rank(F, ranks[i], fmt::format("{}[{}]", key::kRanks, i)));
    if (plan_states != nullptr) {
      r.plan->push_back(read_plan_rank(F, (*plan_states)[i], (*plan_comm)[i],
                                       plan_outer != nullptr ? &(*plan_outer)[i] : nullptr, i));
    }
  }
}

}  // namespace

RunReport report_from_json(const json& root, const std::string& file) {
  if (!root.is_object() || looks_like_step(root)) {
    throw InvalidArgument(fmt::format(
        "report '{}' is not a zerodp train report: it holds {}", file,
        looks_like_step(root) ? "one step record; pass a --metrics log with --metrics"
                              : fmt::format("a JSON {}, not an object", root.type_name())));
  }
  const Fields F(file);
  RunReport r;
  r.zerodp_version = F.string(root, "", key::kVersion);  // the mark of a report
  r.params = F.count(root, "", key::kParams);
  const uint64_t world = F.count(root, "", key::kWorldSize);
  const uint64_t stage = F.count(root, "", key::kStage);
  if (world < 1 || world > (1u << 20)) F.bad(key::kWorldSize, fmt::format("is {}", world));
  if (stage > 3) F.bad(key::kStage, fmt::format("is {}; stages are 0..3", stage));
  r.world_size = static_cast<int>(world);
  r.stage = static_cast<int>(stage);
  const std::string precision = F.string(root, "", key::kPrecision);
  const auto p = parse_precision(precision);
  if (!p) F.bad(key::kPrecision, fmt::format("is '{}'; expected bf16, fp16 or fp32", precision));
  r.precision = *p;
  r.backend = F.string(root, "", key::kBackend);
  r.data = string_if_any(root, key::kData).value_or("");
  r.resumed_from = string_if_any(root, key::kResumedFrom);
  if (const auto it = root.find(key::kInitFrom); it != root.end() && it->is_object()) {
    r.init_sha256 = string_if_any(*it, "sha256");
  }
  read_config(F, root, r);

  const json& final = F.object(root, "", key::kFinal);
  r.final_loss = F.number_or_null(final, key::kFinal, key::kLoss);
  r.final_val_loss = F.number_or_null(final, key::kFinal, key::kValLoss);
  r.weights_sha256 = F.string(final, key::kFinal, key::kWeightsSha256);
  const json& tp = F.object(root, "", key::kThroughput);
  r.tokens_per_second = F.number_or_null(tp, key::kThroughput, key::kTokensPerSecond);
  r.mfu = F.number_or_null(tp, key::kThroughput, key::kMfu);

  const json& steps = F.array(root, "", key::kSteps);
  if (root.contains(key::kHistory)) {
    r.history = read_steps(F.array(root, "", key::kHistory), key::kHistory, F.refuse());
  }
  r.steps = read_steps(steps, key::kSteps, F.refuse());
  // null: the run reached its last step; reports before early stops were recorded lack it.
  if (root.contains(key::kStopped) && !root[key::kStopped].is_null()) {
    if (!root[key::kStopped].is_object()) F.bad(key::kStopped, "is not an object or null");
    r.stopped = read_stop(F, root[key::kStopped]);
  }
  // Reports before elastic restarts have no `restarts`.
  if (root.contains(key::kRestarts)) {
    const json& restarts = F.array(root, "", key::kRestarts);
    for (size_t i = 0; i < restarts.size(); ++i) {
      r.restarts.push_back(read_restart(F, restarts[i], fmt::format("{}[{}]", key::kRestarts, i)));
    }
  }

  read_ranks(F, root, r);
  return r;
}

RunReport parse_report(std::string_view text, const std::string& file) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    // A JSON-lines log parses line by line: say what it is instead of "not JSON".
    const json first = json::parse(text.substr(0, text.find('\n')), nullptr, false);
    if (!first.is_discarded() && looks_like_step(first)) {
      throw InvalidArgument(fmt::format(
          "report '{}' is a --metrics log (one JSON line per step), not a report; pass it "
          "with --metrics",
          file));
    }
    throw CorruptData(fmt::format("report '{}' is not valid JSON: {}", file, parse_message(e)));
  }
  return report_from_json(root, file);
}

RunReport read_report(const std::string& path) {
  return parse_report(read_text("report", path), path);
}

std::vector<ReportStep> parse_metrics(std::string_view text, const std::string& file) {
  const json whole = json::parse(text, nullptr, false);
  if (!whole.is_discarded() && whole.is_object() && whole.contains(key::kVersion)) {
    throw InvalidArgument(fmt::format(
        "metrics '{}' is a run report, not a --metrics log; pass it without --metrics", file));
  }
  std::vector<ReportStep> steps;
  size_t pos = 0;
  int line = 0;
  while (pos < text.size()) {
    const auto nl = text.find('\n', pos);
    const bool complete = nl != std::string_view::npos;
    const std::string_view row = text.substr(pos, complete ? nl - pos : std::string_view::npos);
    pos = complete ? nl + 1 : text.size();
    ++line;
    if (row.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    json j;
    try {
      j = json::parse(row);
    } catch (const json::parse_error& e) {
      if (!complete) break;
      throw CorruptData(
          fmt::format("metrics '{}' line {} is not valid JSON: {}", file, line, parse_message(e)));
    }
    if (!looks_like_step(j)) {
      throw InvalidArgument(
          fmt::format("metrics '{}' line {} is not a zerodp step record (no '{}' and '{}')", file,
                      line, key::kStep, key::kLoss));
    }
    // A line is one record, so its keys are named without a path ("[0].loss" -> "loss").
    steps.push_back(read_step(j, "[0]", [&](const std::string& k, const std::string& what) {
      throw InvalidArgument(fmt::format("metrics '{}' line {}: '{}' {}", file, line,
                                        k.substr(k.find('.') + 1), what));
    }));
  }
  return steps;
}

std::vector<ReportStep> read_metrics(const std::string& path) {
  return parse_metrics(read_text("metrics", path), path);
}

}  // namespace zerodp
