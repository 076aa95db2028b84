// The run report (docs/report.md is its contract) and the end-of-run summary table.
// train/report_reader.h reads the report back, by the same keys.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "train/result.h"

namespace zerodp {

// The report's keys, spelled once: report_json writes them and read_report
// (train/report_reader.h) reads them, so neither can rename one alone. Inside `ranks` and
// `plan` the categories and collectives are the ledgers' own names (mem_category_name,
// comm_kind_name); `config` is config_json's (train/config.h).
namespace report_key {
// The top level.
inline constexpr char kVersion[] = "zerodp_version";
inline constexpr char kConfig[] = "config";
inline constexpr char kParams[] = "params";
inline constexpr char kWorldSize[] = "world_size";
inline constexpr char kStage[] = "stage";
inline constexpr char kBackend[] = "backend";
inline constexpr char kPrecision[] = "precision";
inline constexpr char kData[] = "data";
inline constexpr char kResumedFrom[] = "resumed_from";
inline constexpr char kInitFrom[] = "init_from";
inline constexpr char kHistory[] = "history";
inline constexpr char kSteps[] = "steps";
inline constexpr char kFinal[] = "final";
inline constexpr char kStopped[] = "stopped";
inline constexpr char kThroughput[] = "throughput";
inline constexpr char kProcess[] = "process";
inline constexpr char kUnits[] = "units";
inline constexpr char kRanks[] = "ranks";
inline constexpr char kPlan[] = "plan";
inline constexpr char kRestarts[] = "restarts";
// With --checkpoint-dir: what the saves did (train/result.h's SaveStats).
inline constexpr char kCheckpoints[] = "checkpoints";
inline constexpr char kAsync[] = "async";
inline constexpr char kRequested[] = "requested";
inline constexpr char kCommitted[] = "committed";
inline constexpr char kAbandoned[] = "abandoned";  // the step a signal abandoned, or null
inline constexpr char kStallSeconds[] = "stall_seconds";
inline constexpr char kWriteSeconds[] = "write_seconds";
inline constexpr char kWriteCpuSeconds[] = "write_cpu_seconds";
// A step (`steps[i]`, `history[i]`, a --metrics line); `final` has `loss` and `val_loss` too.
inline constexpr char kStep[] = "step";
inline constexpr char kLoss[] = "loss";
inline constexpr char kLr[] = "lr";
inline constexpr char kGradNorm[] = "grad_norm";
inline constexpr char kGradNormClipped[] = "grad_norm_clipped";
inline constexpr char kLossScale[] = "loss_scale";
inline constexpr char kSkipped[] = "skipped";
inline constexpr char kOuter[] = "outer";
inline constexpr char kTokens[] = "tokens";
inline constexpr char kSeconds[] = "seconds";
inline constexpr char kMfu[] = "mfu";  // also in `throughput`
inline constexpr char kValLoss[] = "val_loss";
inline constexpr char kCheckpoint[] = "checkpoint";
// `final`, `stopped`, `throughput`, `process`, `units[i]`.
inline constexpr char kWeightsSha256[] = "weights_sha256";
inline constexpr char kSamplesChain[] = "samples_chain_sha256";
inline constexpr char kValBitsPerByte[] = "val_bits_per_byte";
inline constexpr char kDataSeconds[] = "data_seconds";
inline constexpr char kDataTokenizer[] = "data_tokenizer_sha256";
inline constexpr char kSamplesChainFrom[] = "samples_chain_from_step";
inline constexpr char kReason[] = "reason";
inline constexpr char kSignal[] = "signal";
inline constexpr char kAfterStep[] = "after_step";
inline constexpr char kMessage[] = "message";
// `restarts[i]` (TrainResult::restarts).
inline constexpr char kFailedStep[] = "failed_step";
inline constexpr char kFailedRank[] = "failed_rank";
inline constexpr char kCause[] = "cause";
inline constexpr char kRanksBefore[] = "ranks_before";
inline constexpr char kRanksAfter[] = "ranks_after";
inline constexpr char kGradAccumBefore[] = "grad_accum_before";
inline constexpr char kGradAccumAfter[] = "grad_accum_after";
inline constexpr char kResumedStep[] = "resumed_step";
inline constexpr char kOrderNote[] = "order_note";
inline constexpr char kTokensPerSecond[] = "tokens_per_second";
inline constexpr char kFlopsPerToken[] = "flops_per_token";
inline constexpr char kPeakFlops[] = "peak_flops";
inline constexpr char kPeakCores[] = "peak_cores";
inline constexpr char kPeakFlopsModelShapes[] = "peak_flops_model_shapes";
inline constexpr char kMfuModelShapes[] = "mfu_model_shapes";
inline constexpr char kStepSecondsMedian[] = "step_seconds_median";
inline constexpr char kPeakRssBytes[] = "peak_rss_bytes";
inline constexpr char kName[] = "name";  // and `params`
// `ranks[r]` and `plan`.
inline constexpr char kRank[] = "rank";
inline constexpr char kModelStateBytes[] = "model_state_bytes";
inline constexpr char kPeakBytes[] = "peak_bytes";
inline constexpr char kTotal[] = "total";
inline constexpr char kOutsideLedgerBytes[] = "outside_ledger_bytes";
inline constexpr char kGemmBf16Copies[] = "gemm_bf16_copies";
inline constexpr char kComm[] = "comm";
inline constexpr char kCommOther[] = "comm_other";
inline constexpr char kCalls[] = "calls";
inline constexpr char kBytes[] = "bytes";
inline constexpr char kCrossNodeBytes[] = "cross_node_bytes";
inline constexpr char kSamplesSha256[] = "samples_sha256";
inline constexpr char kNvmeBytes[] = "nvme_bytes";
inline constexpr char kCommBytesPerStep[] = "comm_bytes_per_step";
inline constexpr char kCommBytesPerOuterStep[] = "comm_bytes_per_outer_step";
inline constexpr char kCommBytesOuterSteps[] = "comm_bytes_outer_steps";
}  // namespace report_key

nlohmann::json step_json(const StepRecord& s);
nlohmann::json report_json(const TrainResult& r);

// Per-rank memory by category and comm bytes per step, for a terminal.
std::string summary_table(const TrainResult& r);
// Per rank: model-state bytes and comm bytes per step, measured next to the formula.
std::string formula_table(const TrainResult& r);

}  // namespace zerodp
