#include "train/report.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/core.h>

#include "core/error.h"
#include "core/units.h"
#include "core/version.h"
#include "train/holdings.h"
#include "train/outer_step.h"
#include "train/plan.h"
#include "train/stop.h"

namespace zerodp {

namespace key = report_key;

namespace {
nlohmann::json or_null(const std::optional<double>& x) {
  return x ? nlohmann::json(*x) : nlohmann::json();
}
}  // namespace

nlohmann::json step_json(const StepRecord& s) {
  nlohmann::json j;
  j[key::kStep] = s.step;
  j[key::kLoss] = s.loss;
  j[key::kLr] = s.lr;
  j[key::kGradNorm] = s.grad_norm;
  j[key::kGradNormClipped] = s.grad_norm_clipped;
  j[key::kLossScale] = s.loss_scale ? nlohmann::json(*s.loss_scale) : nlohmann::json();
  j[key::kSkipped] = s.skipped;
  j[key::kTokens] = s.tokens;
  j[key::kSeconds] = s.seconds;
  j[key::kDataSeconds] = s.data_seconds;
  j[key::kMfu] = s.mfu ? nlohmann::json(*s.mfu) : nlohmann::json();
  if (s.val_loss) j[key::kValLoss] = *s.val_loss;
  if (!s.checkpoint.empty()) j[key::kCheckpoint] = s.checkpoint;
  if (s.outer) j[key::kOuter] = true;
  return j;
}

namespace {

nlohmann::json comm_json(const CommLedger::Table& t) {
  nlohmann::json j;
  for (int k = 0; k < kNumCommKinds; ++k) {
    j[std::string(comm_kind_name(static_cast<CommKind>(k)))] = {
        {key::kCalls, t[k].calls},
        {key::kBytes, t[k].bytes},
        {key::kCrossNodeBytes, t[k].cross_node_bytes}};
  }
  return j;
}

std::string name(MemCategory c) { return std::string(mem_category_name(c)); }
std::string name(CommKind k) { return std::string(comm_kind_name(k)); }

// One rank's summary: its model states, peaks, traffic and samples' hash.
nlohmann::json rank_json(const RankSummary& rank, const TrainConfig& c) {
  nlohmann::json rj;
  rj[key::kRank] = rank.rank;
  nlohmann::json states, peak;
  for (int k = 0; k < kNumMemCategories; ++k) {
    const std::string cat = name(static_cast<MemCategory>(k));
    if (k <= static_cast<int>(MemCategory::kAdamV)) states[cat] = rank.model_state[k];
    peak[cat] = rank.peak[k];
  }
  peak[key::kTotal] = rank.peak_total;
  rj[key::kModelStateBytes] = states;
  rj[key::kPeakBytes] = peak;
  rj[key::kOutsideLedgerBytes] = {{key::kGemmBf16Copies, rank.gemm_bf16_copy_bytes}};
  if (c.offload != Offload::kNone) {
    rj[key::kNvmeBytes] = rank.nvme_bytes;
    rj["offload_io"] = {{"bytes_read", rank.offload_bytes_read},
                        {"bytes_written", rank.offload_bytes_written},
                        {"wait_seconds", rank.offload_wait_seconds},
                        {"update_bytes", rank.offload_update_bytes},
                        {"update_seconds", rank.offload_update_seconds},
                        {"direct", rank.offload_direct}};
  }
  rj[key::kComm] = comm_json(rank.comm_train);
  rj[key::kCommOther] = comm_json(rank.comm_other);
  rj[key::kSamplesSha256] = rank.samples_sha256;
  return rj;
}

// The planner's bytes for rank `rank`: per step of training, and with --islands per round
// of outer steps (every fragment's exchange, on top of its inner steps').
struct PlannedComm {
  CommBytes step, outer;
};
PlannedComm planned_comm(const TrainResult& r, int rank) {
  const TrainConfig& c = r.config;
  CommModes modes = comm_modes_of(c);
  if (c.islands == 1) {
    return {comm_bytes_per_step(r.unit_numel, r.world_size, c.stage, c.precision, c.grad_accum,
                                c.accumulate, canonical_order(c), rank, modes),
            {}};
  }
  const IslandLayout l = island_layout(c, r.world_size);
  modes.node_ranks = l.inside_node_ranks;
  return {comm_bytes_per_step(r.unit_numel, l.ranks, c.stage, c.precision, c.grad_accum,
                              c.accumulate, canonical_order(c), rank % l.ranks, modes)
              .times(static_cast<uint64_t>(hosted_islands(c))),
          outer_round_bytes(r.unit_numel, l, rank)};
}

// The outer exchanges the run's own steps started, for rank `rank`: with the inner steps'
// bytes, what its comm ledger counted over `steps` (control aside). Zero without --islands.
CommBytes planned_outer_comm(const TrainResult& r, int rank) {
  const TrainConfig& c = r.config;
  CommBytes sum;
  if (c.islands == 1) return sum;
  const IslandLayout l = island_layout(c, r.world_size);
  for (const StepRecord& s : r.steps) {
    for (int f : fragments_ending(c, s.step)) {
      sum += outer_step_bytes(r.unit_numel, l, rank, f);
    }
  }
  return sum;
}

// The planner's exact bytes beside the measured ones, so a reader of the report (zerodp
// report) compares without re-deriving ragged partitions from the units.
nlohmann::json plan_json(const TrainResult& r) {
  const TrainConfig& c = r.config;
  nlohmann::json plan_states = nlohmann::json::array(), plan_comm = nlohmann::json::array(),
                 plan_outer = nlohmann::json::array(), plan_outer_steps = nlohmann::json::array();
  const PlannedModel planned{.units = r.unit_numel, .tensors = r.unit_tensors};
  for (int rank = 0; rank < r.world_size; ++rank) {
    const Holdings h = rank_holdings(c, planned, r.world_size, rank);
    const StateBytes& s = h.states;
    plan_states.push_back({{name(MemCategory::kParams), s.params},
                           {name(MemCategory::kGrads), s.grads},
                           {name(MemCategory::kMaster), s.master},
                           {name(MemCategory::kAdamM), s.adam_m},
                           {name(MemCategory::kAdamV), s.adam_v},
                           {key::kTotal, s.total()}});
    if (c.offload != Offload::kNone) plan_states.back()["nvme"] = s.nvme;
    const PlannedComm pc = planned_comm(r, rank);
    const auto comm = [&](const CommBytes& cb) -> nlohmann::json {
      return {{name(CommKind::kAllReduce), cb.all_reduce},
              {name(CommKind::kReduceScatter), cb.reduce_scatter},
              {name(CommKind::kAllGather), cb.all_gather},
              {key::kTotal, cb.total()},
              {key::kCrossNodeBytes, cb.cross_total()}};
    };
    plan_comm.push_back(comm(pc.step));
    if (c.islands > 1) {
      plan_outer.push_back(comm(pc.outer));
      plan_outer_steps.push_back(comm(planned_outer_comm(r, rank)));
      plan_states.back()[name(MemCategory::kOuterState)] = h.outer_state;
    }
    if (c.checkpoint_async && !c.checkpoint_dir.empty()) {
      plan_states.back()[name(MemCategory::kCheckpointStaging)] = h.checkpoint_staging;
    }
  }
  nlohmann::json j{{key::kModelStateBytes, plan_states}, {key::kCommBytesPerStep, plan_comm}};
  if (c.islands > 1) {
    j[key::kCommBytesPerOuterStep] = plan_outer;
    j[key::kCommBytesOuterSteps] = plan_outer_steps;
  }
  return j;
}

}  // namespace

nlohmann::json report_json(const TrainResult& r) {
  nlohmann::json j;
  j[key::kVersion] = zerodp_version();
  j[key::kConfig] = config_json(r.config);
  j[key::kParams] = r.params;
  j[key::kWorldSize] = r.world_size;
  j[key::kStage] = r.config.stage;
  j[key::kBackend] = r.backend;
  j[key::kPrecision] = std::string(precision_name(r.config.precision));
  j[key::kData] = r.data_description;
  j[key::kDataTokenizer] =
      r.data_tokenizer_sha256.empty() ? nlohmann::json() : nlohmann::json(r.data_tokenizer_sha256);
  j[key::kResumedFrom] = r.resumed_from.empty() ? nlohmann::json() : nlohmann::json(r.resumed_from);
  // The weights a fresh start took (--init-from): the file and its sha256.
  j[key::kInitFrom] = r.init_sha256.empty()
                          ? nlohmann::json()
                          : nlohmann::json{{"file", r.config.init_from}, {"sha256", r.init_sha256}};
  // The steps before this run, from the checkpoint: only what the training determines, so
  // no timing or MFU (those of "steps" and "throughput" are this run's alone).
  j[key::kHistory] = nlohmann::json::array();
  for (const auto& s : r.history) {
    nlohmann::json h = step_json(s);
    h.erase(key::kSeconds);
    h.erase(key::kDataSeconds);
    h.erase(key::kMfu);
    j[key::kHistory].push_back(std::move(h));
  }
  j[key::kSteps] = nlohmann::json::array();
  for (const auto& s : r.steps) j[key::kSteps].push_back(step_json(s));
  j[key::kFinal] = {{key::kLoss, r.final_loss},
                    {key::kValLoss, r.val_loss ? nlohmann::json(*r.val_loss) : nlohmann::json()},
                    {key::kValBitsPerByte,
                     r.val_bits_per_byte ? nlohmann::json(*r.val_bits_per_byte) : nlohmann::json()},
                    {key::kWeightsSha256, r.weights_sha256},
                    {key::kSamplesChain, r.samples_chain},
                    {key::kSamplesChainFrom, r.samples_chain_from}};
  // An early stop is part of the record: a reader must not take a cut-short run for one
  // that reached --steps.
  if (r.stopped) {
    const bool signal = r.stopped->reason == EarlyStop::Reason::kSignal;
    j[key::kStopped] = {
        {key::kReason, signal                                              ? "signal"
                       : r.stopped->reason == EarlyStop::Reason::kMaxSkips ? "max_skips"
                                                                           : "checkpoint_failed"},
        {key::kSignal, signal ? nlohmann::json(signal_name(r.stopped->signal)) : nlohmann::json()},
        {key::kAfterStep, r.stopped->after_step},
        {key::kMessage, r.stopped->message}};
  } else {
    j[key::kStopped] = nullptr;
  }
  // Restarts (--max-restarts): the launch this report describes came after these.
  j[key::kRestarts] = nlohmann::json::array();
  for (const Restart& x : r.restarts) {
    j[key::kRestarts].push_back(
        {{key::kFailedStep, x.failed_step},
         {key::kFailedRank, x.failed_rank >= 0 ? nlohmann::json(x.failed_rank) : nlohmann::json()},
         {key::kCause, x.cause},
         {key::kRanksBefore, x.ranks_before},
         {key::kRanksAfter, x.ranks_after},
         {key::kGradAccumBefore, x.grad_accum_before},
         {key::kGradAccumAfter, x.grad_accum_after},
         {key::kResumedStep, x.resumed_step},
         {key::kCheckpoint, x.checkpoint},
         // Why the survivors' bits may differ from the run that never failed; "" when not.
         {key::kOrderNote, x.order_note}});
  }
  // The saves the schedule asked for, skipped and committed, and what each cost the steps.
  if (!r.config.checkpoint_dir.empty()) {
    j[key::kCheckpoints] = {{key::kAsync, r.config.checkpoint_async},
                            {key::kRequested, r.saves.requested},
                            {key::kSkipped, r.saves.skipped},
                            {key::kCommitted, r.saves.committed},
                            {key::kAbandoned, r.saves.abandoned ? nlohmann::json(*r.saves.abandoned)
                                                                : nlohmann::json()},
                            {key::kStallSeconds, r.saves.stall_seconds},
                            {key::kWriteSeconds, r.saves.write_seconds},
                            {key::kWriteCpuSeconds, r.saves.write_cpu_seconds}};
  }
  j[key::kThroughput] = {{key::kTokensPerSecond, r.tokens_per_second},
                         {key::kMfu, r.mfu},
                         {key::kFlopsPerToken, r.flops_per_token},
                         {key::kPeakFlops, r.peak_flops},
                         {key::kPeakCores, r.peak_cores},
                         {key::kPeakFlopsModelShapes, or_null(r.peak_flops_model_shapes)},
                         {key::kMfuModelShapes, or_null(r.mfu_model_shapes)},
                         {key::kStepSecondsMedian, r.step_seconds_median}};
  j[key::kProcess] = {{key::kPeakRssBytes, r.process_peak_rss_bytes}};
  j[key::kUnits] = nlohmann::json::array();
  for (size_t i = 0; i < r.unit_names.size(); ++i) {
    j[key::kUnits].push_back({{key::kName, r.unit_names[i]}, {key::kParams, r.unit_numel[i]}});
  }
  j[key::kRanks] = nlohmann::json::array();
  for (const auto& rank : r.ranks) j[key::kRanks].push_back(rank_json(rank, r.config));
  j[key::kPlan] = plan_json(r);
  return j;
}

std::string summary_table(const TrainResult& r) {
  std::string out;
  const double steps = static_cast<double>(std::max<size_t>(1, r.steps.size()));
  out += fmt::format("Per-rank memory (peak bytes by category) and communication per step:\n");
  // Nodes given: the part of the traffic that crossed them, a column of its own.
  const bool nodes = r.config.launch.comm.node_ranks > 0;
  // Offloaded: the states on disk, a column of their own (not in the memory total).
  const bool nvme = r.config.offload != Offload::kNone;
  out +=
      fmt::format("{:>5} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10}{}{}\n",
                  "rank", "params", "grads", "master", "adam_m+v", "gathered", "activations",
                  "other", "total", "comm/step", nodes ? fmt::format(" {:>11}", "cross-node") : "",
                  nvme ? fmt::format(" {:>10}", "nvme") : "");
  for (const auto& rank : r.ranks) {
    const auto& p = rank.peak;
    auto cat = [&](MemCategory c) { return static_cast<double>(p[static_cast<int>(c)]); };
    const double other = cat(MemCategory::kGradBuckets) + cat(MemCategory::kGradAccum) +
                         cat(MemCategory::kHpzParams) + cat(MemCategory::kCommBuffers) +
                         cat(MemCategory::kWorkspace) + cat(MemCategory::kOffloadStaging) +
                         cat(MemCategory::kOuterState) + cat(MemCategory::kCheckpointStaging);
    uint64_t comm = 0, cross = 0;
    for (int k = 0; k < kNumCommKinds; ++k) {
      comm += rank.comm_train[k].bytes;
      cross += rank.comm_train[k].cross_node_bytes;
    }
    out += fmt::format(
        "{:>5} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10}{}{}\n", rank.rank,
        format_bytes(cat(MemCategory::kParams)), format_bytes(cat(MemCategory::kGrads)),
        format_bytes(cat(MemCategory::kMaster)),
        format_bytes(cat(MemCategory::kAdamM) + cat(MemCategory::kAdamV)),
        format_bytes(cat(MemCategory::kGathered)), format_bytes(cat(MemCategory::kActivations)),
        format_bytes(other), format_bytes(static_cast<double>(rank.peak_total)),
        format_bytes(static_cast<double>(comm) / steps),
        nodes ? fmt::format(" {:>11}", format_bytes(static_cast<double>(cross) / steps)) : "",
        nvme ? fmt::format(" {:>10}", format_bytes(static_cast<double>(rank.nvme_bytes))) : "");
  }
  if (nvme && !r.ranks.empty() && r.ranks[0].offload_update_seconds > 0) {
    // The rate this disk gave the tier, to plan the next run by: in estimate's terms one
    // figure for both directions, io s = nvme / R + nvme / R.
    const RankSummary& r0 = r.ranks[0];
    const double rate = static_cast<double>(r0.offload_update_bytes) / r0.offload_update_seconds;
    out += fmt::format(
        "offload: rank 0's updates moved {} (read + written) in {:.2f} s: {:.0f} MB/s, the "
        "figure for estimate --disk-bandwidth {:.4g}\n",
        format_bytes(static_cast<double>(r0.offload_update_bytes)), r0.offload_update_seconds,
        rate / 1e6, rate);
  }
  return out;
}

std::string formula_table(const TrainResult& r) {
  const TrainConfig& c = r.config;
  std::string out =
      fmt::format("Measured against the ZeRO formulas (stage {}, {} ranks, Φ = {}, A = {}, {}):\n",
                  c.stage, r.world_size, r.params, c.grad_accum, accumulate_name(c.accumulate));
  if (c.offload == Offload::kOptimizer) {
    out += "(states in memory: --offload optimizer keeps master and Adam moments on disk)\n";
  } else if (c.offload == Offload::kParams) {
    out +=
        "(states in memory: --offload optimizer,params keeps master, Adam moments and the "
        "parameter shards on disk)\n";
  }
  out += fmt::format("{:>5} {:>14} {:>14} {:>6} {:>16} {:>16} {:>6}\n", "rank", "states", "formula",
                     "", "comm/step", "formula", "");
  const double steps = static_cast<double>(std::max<size_t>(1, r.steps.size()));
  const PlannedModel model{.units = r.unit_numel, .tensors = r.unit_tensors};
  for (const auto& rank : r.ranks) {
    const StateBytes plan = rank_holdings(c, model, r.world_size, rank.rank).states;
    uint64_t states = 0;
    for (int k = 0; k <= static_cast<int>(MemCategory::kAdamV); ++k) states += rank.model_state[k];
    uint64_t comm = 0;
    for (int k = 0; k < kNumCommKinds; ++k) {
      if (static_cast<CommKind>(k) != CommKind::kControl) comm += rank.comm_train[k].bytes;
    }
    // With --islands the outer steps' bytes, spread over the run's steps.
    const PlannedComm pc = planned_comm(r, rank.rank);
    const uint64_t outer = planned_outer_comm(r, rank.rank).total();
    const double planned = static_cast<double>(pc.step.total() * r.steps.size() + outer) / steps;
    const double per_step = static_cast<double>(comm) / steps;
    out += fmt::format(
        "{:>5} {:>14} {:>14} {:>6} {:>16} {:>16} {:>6}\n", rank.rank,
        format_bytes(static_cast<double>(states)), format_bytes(static_cast<double>(plan.total())),
        states == plan.total() ? "exact" : "DIFF", format_bytes(per_step), format_bytes(planned),
        r.steps.empty()       ? "-"
        : per_step == planned ? "exact"
                              : "DIFF");
  }
  return out;
}

}  // namespace zerodp
