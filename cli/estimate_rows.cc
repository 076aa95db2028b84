// estimate_rows.h is the contract.
#include "estimate_rows.h"

#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/core.h>

namespace zerodp::cli {

std::string gb(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1e9) return fmt::format("{:.2f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.2f} MB", b / 1e6);
  return fmt::format("{:.2f} KB", b / 1e3);
}

namespace {

// One figure of a row: its place in the JSON row (empty: the text table's alone) and, where
// it is a column of the text table, the column's header, width and cell. The table and the
// JSON read one walk over a row's fields (walk_row), so neither has a figure the other
// computes apart.
struct Field {
  Field(std::vector<const char*> p, nlohmann::json v, const char* h = nullptr, int w = 11,
        std::string c = {})
      : path(std::move(p)), value(std::move(v)), header(h), width(w), cell(std::move(c)) {}
  std::vector<const char*> path;
  nlohmann::json value;
  const char* header;
  int width;
  std::string cell;
};
using Visit = std::function<void(Field&&)>;

Field bytes_field(std::vector<const char*> path, uint64_t bytes, const char* header = nullptr,
                  int width = 11) {
  return {std::move(path), bytes, header, width, header ? gb(bytes) : std::string()};
}
Field seconds_field(std::vector<const char*> path, double seconds, const char* header = nullptr) {
  return {std::move(path), seconds, header, 9,
          header ? fmt::format("{:.3g}", seconds) : std::string()};
}

// The model states, the row's every-rank total and its comm per step.
void walk_states(const RowColumns& e, const TrainConfig& c, const Forecast& fc, bool fits,
                 const Visit& visit) {
  const StateBytes& s = fc.states;
  const char* kStates = "model_state_bytes";
  visit(bytes_field({kStates, "params"}, s.params, "params"));
  visit(bytes_field({kStates, "grads"}, s.grads, "grads"));
  visit(bytes_field({kStates, "master"}, s.master, "master"));
  visit(bytes_field({kStates, "adam_m"}, s.adam_m));
  visit(bytes_field({kStates, "adam_v"}, s.adam_v));
  visit(bytes_field({}, s.adam_m + s.adam_v, "adam m+v"));
  visit(bytes_field({kStates, "total"}, s.total(), "per rank"));
  // Offload's keys only where it is asked for: rows without it read as they always did.
  if (e.offload) visit(bytes_field({kStates, "nvme"}, s.nvme, "nvme"));
  visit(bytes_field({"all_ranks_bytes"}, fc.all_ranks, "all ranks", 13));
  const CommBytes& b = fc.comm;
  const char* kComm = "comm_bytes_per_step";
  visit(bytes_field({kComm, "all_reduce"}, b.all_reduce));
  visit(bytes_field({kComm, "reduce_scatter"}, b.reduce_scatter));
  visit(bytes_field({kComm, "all_gather"}, b.all_gather));
  visit(bytes_field({kComm, "total"}, b.total(), "comm/step", 13));
  visit({{"fits"},
         e.budget ? nlohmann::json(fits) : nlohmann::json(),
         "fits",
         5,
         e.budget ? (fits ? "yes" : "no") : "-"});
  visit(bytes_field({kComm, "cross_node", "all_reduce"}, b.cross_all_reduce));
  visit(bytes_field({kComm, "cross_node", "reduce_scatter"}, b.cross_reduce_scatter));
  visit(bytes_field({kComm, "cross_node", "all_gather"}, b.cross_all_gather));
  visit(bytes_field({kComm, "cross_node", "total"}, b.cross_total(),
                    c.launch.comm.node_ranks > 0 ? "cross-node" : nullptr));
}

// The transient buffers and the step's seconds, with a model; the offload file's I/O.
void walk_buffers_and_time(const RowColumns& e, const TrainConfig& c, const Forecast& fc,
                           const Visit& visit) {
  const bool offload = e.offload;
  if (const std::optional<TransientBytes>& t = fc.transients) {
    const char* kT = "transient_bytes";
    visit(bytes_field({kT, "activations"}, t->activations, "activations"));
    visit(bytes_field({"peak_bytes"}, fc.need, "peak/rank"));
    visit(bytes_field({kT, "workspace"}, t->workspace));
    visit(bytes_field({kT, "gathered"}, t->gathered));
    visit(bytes_field({kT, "grad_buckets"}, t->grad_buckets));
    visit(bytes_field({kT, "grad_accum"}, t->grad_accum));
    visit(bytes_field({kT, "comm_buffers"}, t->comm_buffers));
    visit(bytes_field({kT, "hpz_params"}, t->hpz_params));
    visit(bytes_field({kT, "total"}, t->total()));
    if (offload) visit(bytes_field({kT, "offload_staging"}, t->offload_staging));
  } else {
    visit({{"transient_bytes"}, nullptr});
    visit({{"peak_bytes"}, nullptr});
  }
  const std::optional<StepTime>& time = fc.time;
  const bool disk = offload && e.disk;
  const char* kS = "step_seconds";
  if (time) {
    visit(seconds_field({kS, "compute"}, time->compute, "compute s"));
    visit(seconds_field({kS, "comm"}, time->comm(), "comm s"));
    visit(seconds_field({kS, "comm_overlappable"}, time->comm_overlap));
    visit(seconds_field({kS, "serial"}, time->serial()));
  } else {
    visit({{kS}, nullptr});
  }
  if (disk) visit(seconds_field({"io_seconds"}, fc.io, "io s"));
  if (time) visit(seconds_field({kS, "overlapped"}, time->overlapped(), disk ? nullptr : "step s"));
  if (!disk) return;
  visit({{"ranks_per_disk"}, fc.disk_sharers});
  if (!time) return;
  visit(seconds_field({kS, "io"}, fc.io));
  visit(seconds_field({kS, "predicted"},
                      offload_step_seconds(*time, fc.io, c.stage, c.offload_overlap), "step s"));
  const std::string bound(step_bound(*time, fc.io));
  visit({{kS, "bound"}, bound, "bound", 7, bound});
}

// Every field of a row, in the text table's column order.
void walk_row(const RowColumns& e, const TrainConfig& c, const Forecast& fc, bool fits,
              const Visit& visit) {
  visit({{"ranks"}, c.launch.ranks, "ranks", 6, std::to_string(c.launch.ranks)});
  visit({{"stage"}, c.stage, "stage", 5, std::to_string(c.stage)});
  visit({{"precision"}, std::string(precision_name(c.precision))});
  visit({{"accumulate"}, std::string(accumulate_name(c.accumulate))});
  visit({{"invariant"}, canonical_order(c) ? "on" : "off"});
  visit({{"collectives"}, std::string(collectives_name(c.launch.comm.two_level))});
  walk_states(e, c, fc, fits, visit);
  walk_buffers_and_time(e, c, fc, visit);
  if (const std::optional<Forecast::Outer>& o = fc.outer) {
    const auto set = [&](const char* key, nlohmann::json v) {
      visit({{"islands", key}, std::move(v)});
    };
    set("islands", c.islands);
    set("outer_every", c.outer_every);
    set("fragments", c.fragments);
    set("outer_state_bytes", o->state);
    set("round_bytes", o->exchange_round.total());
    set("round_cross_node_bytes", o->exchange_round.cross_total());
    set("burst_bytes", o->burst.total());
    set("round_seconds", o->round_seconds ? nlohmann::json(*o->round_seconds) : nlohmann::json());
    set("advised_outer_every",
        o->advised_every ? nlohmann::json(*o->advised_every) : nlohmann::json());
  }
  if (c.checkpoint_async) visit(bytes_field({"checkpoint_staging_bytes"}, fc.checkpoint_staging));
  if (e.offload) visit({{"offload"}, std::string(offload_name(c.offload))});
}

}  // namespace

// The text table's line of a row, or (`headers`) of its column headers.
std::string table_line(const RowColumns& e, const TrainConfig& c, const Forecast& fc, bool fits,
                       bool headers) {
  std::string line;
  walk_row(e, c, fc, fits, [&](Field&& f) {
    if (f.header == nullptr) return;
    line += fmt::format("{}{:>{}}", line.empty() ? "" : " ", headers ? f.header : f.cell, f.width);
  });
  return line;
}

nlohmann::json row_json(const RowColumns& e, const TrainConfig& c, const Forecast& fc, bool fits) {
  nlohmann::json row = nlohmann::json::object();
  walk_row(e, c, fc, fits, [&](Field&& f) {
    if (f.path.empty()) return;
    nlohmann::json* at = &row;
    for (const char* key : f.path) at = &(*at)[key];
    *at = std::move(f.value);
  });
  return row;
}

}  // namespace zerodp::cli
