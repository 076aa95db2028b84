// Reading a run report (docs/report.md; report_json in train/report.h writes it) and a
// --metrics log back into typed values, for zerodp report. The writer and this reader spell
// every key through the same constants (report_key in train/report.h).
//
// Only the keys the page draws are read, and each is checked as it is read: a refusal is
// one line naming the file and the key's path in the report, e.g. "report 'r.json' is not a
// zerodp train report: 'ranks[1].comm' is not an object" (InvalidArgument); a file that is
// not JSON is CorruptData, one that cannot be read IoError. Keys it does not read may hold
// anything, and reports of earlier versions (no `history`, `plan`, `stopped`, `restarts` or
// `cross_node_bytes`) still read.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "memory/ledger.h"
#include "train/config.h"
#include "train/plan.h"

namespace zerodp {

// One point of a loss curve: an element of a report's `steps` or `history`, or a line of a
// --metrics log (step_json writes all three).
struct ReportStep {
  double step = 0;                 // any JSON number; the writer's are integers from 1
  std::optional<double> loss;      // nullopt: the file holds null (the loss was not finite)
  bool evaluated = false;          // the step has a `val_loss`
  std::optional<double> val_loss;  // when evaluated; nullopt: null in the file, not finite
  bool outer = false;              // `outer`: the step ended with DiLoCo's outer step
};

struct ReportRank {
  uint64_t rank = 0;
  // `model_state_bytes`: the model-state categories (params .. adam_v); the rest stay 0.
  MemoryLedger::Table model_state{};
  // `peak_bytes`: the transient categories (gathered .. workspace); the model states' own
  // peaks are not read and stay 0.
  MemoryLedger::Table peak{};
  uint64_t peak_total = 0;                     // `peak_bytes.total`
  std::map<std::string, uint64_t> comm_bytes;  // `comm[kind].bytes`, for each kind the file holds
  // `comm[kind].cross_node_bytes`, the part of `bytes` from peers on other nodes, for each
  // kind that has it: reports written before nodes existed have none.
  std::map<std::string, uint64_t> comm_cross_node_bytes;
  // `nvme_bytes`: the offload file's bytes; 0 for a run without --offload (no key).
  uint64_t nvme_bytes = 0;
};

// The planner's figures for one rank, as the file holds them (`plan`).
struct ReportPlanRank {
  StateBytes model_state;            // `model_state_bytes[r]`
  uint64_t model_state_total = 0;    // its `total`, as written
  uint64_t comm_bytes_per_step = 0;  // `comm_bytes_per_step[r].total`
  // `comm_bytes_per_step[r].cross_node_bytes`; nullopt in reports written before the plan
  // had it.
  std::optional<uint64_t> comm_cross_node_bytes_per_step;
  // With --islands, `comm_bytes_outer_steps[r]`: the outer exchanges the run's steps started,
  // over the whole run (`total`, `cross_node_bytes`); nullopt without islands, and in reports
  // written before the plan had it.
  std::optional<uint64_t> comm_bytes_outer_steps;
  std::optional<uint64_t> comm_cross_node_bytes_outer_steps;
};

// `config`, when it is an object: what names the model (config_json's keys).
struct ReportModel {
  std::string model;                // "" when missing or not a string
  std::optional<std::string> size;  // the gpt's size preset, when a string
};

// An element of `restarts` (--max-restarts): a rank failed and the run went on with fewer.
struct ReportRestart {
  uint64_t failed_step = 0;
  std::optional<uint64_t> failed_rank;  // nullopt: null, the rank was not known
  std::string cause;
  uint64_t ranks_before = 0;
  uint64_t ranks_after = 0;
  uint64_t resumed_step = 0;  // the checkpoint's step it went on from
  std::string order_note;     // why the bits may change; empty when kept or not recorded
};

// `stopped`, when not null: the run ended before its last step.
struct ReportStop {
  std::string reason;                 // "signal", "max_skips", "checkpoint_failed" (any string)
  std::optional<std::string> signal;  // "SIGTERM"; nullopt when null
  uint64_t after_step = 0;            // the last step taken
  std::string message;
};

struct RunReport {
  std::string zerodp_version;
  uint64_t params = 0;  // Φ
  int world_size = 0;   // 1 .. 2^20
  int stage = 0;        // 0 .. 3
  Precision precision = Precision::kBF16;
  std::string backend;
  std::string data;                         // "" when missing or not a string
  std::optional<std::string> resumed_from;  // nullopt when null, missing or not a string
  std::optional<std::string> init_sha256;   // init_from's sha256; nullopt without one
  std::optional<ReportModel> model;         // nullopt when `config` is not an object
  std::optional<double> final_loss;         // nullopt: null (no step taken, or not finite)
  std::optional<double> final_val_loss;     // nullopt: null
  std::string weights_sha256;
  std::optional<double> tokens_per_second;          // nullopt: null
  std::optional<double> mfu;                        // nullopt: null
  std::vector<ReportStep> history;                  // empty when missing (earlier versions)
  std::vector<ReportStep> steps;                    // this run's own
  std::vector<ReportRank> ranks;                    // world_size of them
  std::optional<std::vector<ReportPlanRank>> plan;  // world_size of them; nullopt when missing
  std::optional<ReportStop> stopped;                // nullopt: null (it reached its last step)
                                                    // or missing (earlier versions)
  std::vector<ReportRestart> restarts;              // empty when missing (earlier versions)
  // `config.steps` and `config.stop_after` (--stop-after, a time slice the run ends at without
  // a `stopped`), shown only: nullopt when missing or not a non-negative integer.
  std::optional<uint64_t> planned_steps;
  std::optional<uint64_t> stop_after;
  // `config.node_ranks` (--node-ranks T: ranks per node); nullopt when null or missing (one
  // node, or a report written before nodes existed) or when `config` is not an object.
  std::optional<uint64_t> node_ranks;
  // `config.islands` (DiLoCo, --islands): 1 when missing or null.
  uint64_t islands = 1;
  // The ranks a unit's states are sharded over, as the planner has them (shard_ranks in
  // train/plan.h, from `config.islands`, `islands_in_turn`, `shard_within_node` and
  // `node_ranks`): an island's with --islands, a node's with --shard-within-node, else N.
  int shard_ranks = 0;
};

// A report file; messages start "report '<path>'". A --metrics log passed as a report is
// refused saying so.
RunReport read_report(const std::string& path);
// The same for text already read; `file` names it in messages.
RunReport parse_report(std::string_view text, const std::string& file);
RunReport report_from_json(const nlohmann::json& root, const std::string& file);

// A --metrics log: one step record per line. A last line without its newline is a write in
// progress (the trainer writes a line, then flushes) and is left out, so a page can be made
// of a run that is still going. Messages start "metrics '<path>'"; a report passed as a log
// is refused saying so.
std::vector<ReportStep> read_metrics(const std::string& path);
std::vector<ReportStep> parse_metrics(std::string_view text, const std::string& file);

}  // namespace zerodp
