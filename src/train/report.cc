#include "train/report.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/core.h>

#include "core/error.h"
#include "core/units.h"
#include "core/version.h"
#include "train/plan.h"
#include "train/stop.h"

namespace zerodp {

nlohmann::json step_json(const StepRecord& s) {
  nlohmann::json j;
  j["step"] = s.step;
  j["loss"] = s.loss;
  j["lr"] = s.lr;
  j["grad_norm"] = s.grad_norm;
  j["grad_norm_clipped"] = s.grad_norm_clipped;
  j["loss_scale"] = s.loss_scale ? nlohmann::json(*s.loss_scale) : nlohmann::json();
  j["skipped"] = s.skipped;
  j["tokens"] = s.tokens;
  j["seconds"] = s.seconds;
  j["mfu"] = s.mfu ? nlohmann::json(*s.mfu) : nlohmann::json();
  if (s.val_loss) j["val_loss"] = *s.val_loss;
  if (!s.checkpoint.empty()) j["checkpoint"] = s.checkpoint;
  return j;
}

namespace {

nlohmann::json comm_json(const CommLedger::Table& t) {
  nlohmann::json j;
  for (int k = 0; k < kNumCommKinds; ++k) {
    j[std::string(comm_kind_name(static_cast<CommKind>(k)))] = {{"calls", t[k].calls},
                                                                {"bytes", t[k].bytes}};
  }
  return j;
}

}  // namespace

nlohmann::json report_json(const TrainResult& r) {
  nlohmann::json j;
  j["zerodp_version"] = zerodp_version();
  j["config"] = config_json(r.config);
  j["params"] = r.params;
  j["world_size"] = r.world_size;
  j["stage"] = r.config.stage;
  j["backend"] = r.backend;
  j["precision"] = std::string(precision_name(r.config.precision));
  j["data"] = r.data_description;
  j["resumed_from"] = r.resumed_from.empty() ? nlohmann::json() : nlohmann::json(r.resumed_from);
  // The steps before this run, from the checkpoint: only what the training determines, so
  // no timing or MFU (those of "steps" and "throughput" are this run's alone).
  j["history"] = nlohmann::json::array();
  for (const auto& s : r.history) {
    nlohmann::json h = step_json(s);
    h.erase("seconds");
    h.erase("mfu");
    j["history"].push_back(std::move(h));
  }
  j["steps"] = nlohmann::json::array();
  for (const auto& s : r.steps) j["steps"].push_back(step_json(s));
  j["final"] = {{"loss", r.final_loss},
                {"val_loss", r.val_loss ? nlohmann::json(*r.val_loss) : nlohmann::json()},
                {"weights_sha256", r.weights_sha256}};
  // An early stop is part of the record: a reader must not take a cut-short run for one
  // that reached --steps.
  if (r.stopped) {
    const bool signal = r.stopped->reason == EarlyStop::Reason::kSignal;
    j["stopped"] = {
        {"reason", signal ? "signal" : "max_skips"},
        {"signal", signal ? nlohmann::json(signal_name(r.stopped->signal)) : nlohmann::json()},
        {"after_step", r.stopped->after_step},
        {"message", r.stopped->message}};
  } else {
    j["stopped"] = nullptr;
  }
  j["throughput"] = {{"tokens_per_second", r.tokens_per_second},
                     {"mfu", r.mfu},
                     {"flops_per_token", r.flops_per_token},
                     {"peak_flops", r.peak_flops},
                     {"peak_cores", r.peak_cores},
                     {"step_seconds_median", r.step_seconds_median}};
  j["process"] = {{"peak_rss_bytes", r.process_peak_rss_bytes}};
  j["units"] = nlohmann::json::array();
  for (size_t i = 0; i < r.unit_names.size(); ++i) {
    j["units"].push_back({{"name", r.unit_names[i]}, {"params", r.unit_numel[i]}});
  }
  j["ranks"] = nlohmann::json::array();
  for (const auto& rank : r.ranks) {
    nlohmann::json rj;
    rj["rank"] = rank.rank;
    nlohmann::json states, peak;
    for (int k = 0; k < kNumMemCategories; ++k) {
      const std::string name(mem_category_name(static_cast<MemCategory>(k)));
      if (k <= static_cast<int>(MemCategory::kAdamV)) states[name] = rank.model_state[k];
      peak[name] = rank.peak[k];
    }
    peak["total"] = rank.peak_total;
    rj["model_state_bytes"] = states;
    rj["peak_bytes"] = peak;
    rj["outside_ledger_bytes"] = {{"gemm_bf16_copies", rank.gemm_bf16_copy_bytes}};
    rj["comm"] = comm_json(rank.comm_train);
    rj["comm_other"] = comm_json(rank.comm_other);
    rj["samples_sha256"] = rank.samples_sha256;
    j["ranks"].push_back(rj);
  }
  // The planner's exact bytes beside the measured ones, so a reader of the report (zerodp
  // report) compares without re-deriving ragged partitions from the units.
  const TrainConfig& c = r.config;
  nlohmann::json plan_states = nlohmann::json::array(), plan_comm = nlohmann::json::array();
  for (int rank = 0; rank < r.world_size; ++rank) {
    const StateBytes s = model_state_bytes(r.unit_numel, r.world_size, c.stage, c.precision, rank);
    plan_states.push_back({{"params", s.params},
                           {"grads", s.grads},
                           {"master", s.master},
                           {"adam_m", s.adam_m},
                           {"adam_v", s.adam_v},
                           {"total", s.total()}});
    const CommBytes cb = comm_bytes_per_step(r.unit_numel, r.world_size, c.stage, c.precision,
                                             c.grad_accum, c.accumulate, rank);
    plan_comm.push_back({{"all_reduce", cb.all_reduce},
                         {"reduce_scatter", cb.reduce_scatter},
                         {"all_gather", cb.all_gather},
                         {"total", cb.total()}});
  }
  j["plan"] = {{"model_state_bytes", plan_states}, {"comm_bytes_per_step", plan_comm}};
  return j;
}

std::string summary_table(const TrainResult& r) {
  std::string out;
  const double steps = static_cast<double>(std::max<size_t>(1, r.steps.size()));
  out += fmt::format("Per-rank memory (peak bytes by category) and communication per step:\n");
  out += fmt::format("{:>5} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10}\n",
                     "rank", "params", "grads", "master", "adam_m+v", "gathered", "activations",
                     "other", "total", "comm/step");
  for (const auto& rank : r.ranks) {
    const auto& p = rank.peak;
    auto cat = [&](MemCategory c) { return static_cast<double>(p[static_cast<int>(c)]); };
    const double other = cat(MemCategory::kGradBuckets) + cat(MemCategory::kCommBuffers) +
                         cat(MemCategory::kWorkspace);
    uint64_t comm = 0;
    for (int k = 0; k < kNumCommKinds; ++k) comm += rank.comm_train[k].bytes;
    out += fmt::format(
        "{:>5} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10}\n", rank.rank,
        format_bytes(cat(MemCategory::kParams)), format_bytes(cat(MemCategory::kGrads)),
        format_bytes(cat(MemCategory::kMaster)),
        format_bytes(cat(MemCategory::kAdamM) + cat(MemCategory::kAdamV)),
        format_bytes(cat(MemCategory::kGathered)), format_bytes(cat(MemCategory::kActivations)),
        format_bytes(other), format_bytes(static_cast<double>(rank.peak_total)),
        format_bytes(static_cast<double>(comm) / steps));
  }
  return out;
}

std::string formula_table(const TrainResult& r) {
  const TrainConfig& c = r.config;
  std::string out =
      fmt::format("Measured against the ZeRO formulas (stage {}, {} ranks, Φ = {}, A = {}, {}):\n",
                  c.stage, r.world_size, r.params, c.grad_accum, accumulate_name(c.accumulate));
  out += fmt::format("{:>5} {:>14} {:>14} {:>6} {:>16} {:>16} {:>6}\n", "rank", "states", "formula",
                     "", "comm/step", "formula", "");
  const double steps = static_cast<double>(std::max<size_t>(1, r.steps.size()));
  for (const auto& rank : r.ranks) {
    const StateBytes plan =
        model_state_bytes(r.unit_numel, r.world_size, c.stage, c.precision, rank.rank);
    uint64_t states = 0;
    for (int k = 0; k <= static_cast<int>(MemCategory::kAdamV); ++k) states += rank.model_state[k];
    uint64_t comm = 0;
    for (int k = 0; k < kNumCommKinds; ++k) {
      if (static_cast<CommKind>(k) != CommKind::kControl) comm += rank.comm_train[k].bytes;
    }
    const CommBytes cplan = comm_bytes_per_step(r.unit_numel, r.world_size, c.stage, c.precision,
                                                c.grad_accum, c.accumulate, rank.rank);
    const double per_step = static_cast<double>(comm) / steps;
    out += fmt::format("{:>5} {:>14} {:>14} {:>6} {:>16} {:>16} {:>6}\n", rank.rank,
                       format_bytes(static_cast<double>(states)),
                       format_bytes(static_cast<double>(plan.total())),
                       states == plan.total() ? "exact" : "DIFF", format_bytes(per_step),
                       format_bytes(static_cast<double>(cplan.total())),
                       per_step == static_cast<double>(cplan.total()) ? "exact" : "DIFF");
  }
  return out;
}

}  // namespace zerodp
