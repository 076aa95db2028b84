// zerodp report: run reports (docs/report.md) and --metrics logs as one self-contained HTML
// page: how each run ended (an early stop, elastic restarts) in its table and on the loss
// curves, per-rank memory by category, comm per step by collective (and, for a run over
// nodes, the part crossing them), and model states measured against the ZeRO formula. The
// page loads nothing (inline CSS, an inline script drawing SVG), so it can be attached to an
// issue or kept as a CI artifact and still open years later without network.
// The inputs are read by train/report_reader.h, which checks everything the script needs, so
// a bad input is refused with a message naming the file and key instead of a half-drawn
// page; this file only reshapes what it read into the page's data (what page.js reads) and
// fills the template.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "core/files.h"
#include "core/units.h"
#include "core/version.h"
#include "memory/ledger.h"
#include "report_page.h"  // generated from report/page.{html,css,js} (cli/CMakeLists.txt)
#include "train/config.h"
#include "train/plan.h"
#include "train/report_reader.h"

namespace zerodp::cli {
namespace {

using nlohmann::json;

struct Flags {
  std::vector<std::string> reports;
  std::vector<std::string> metrics;
  std::string out;
  std::string title;
  bool quiet = false;
};

// `what` is "report" or "metrics": every message starts "<what> '<path>'".
void check_input(const std::string& what, const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(st)) {
    throw InvalidArgument(fmt::format("{} '{}': no such file", what, path));
  }
  if (std::filesystem::is_directory(st)) {
    throw InvalidArgument(fmt::format("{} '{}' is a directory, not a file", what, path));
  }
  // A FIFO would block the read forever, a device would never end.
  files::require_regular_input(what, path);
}

json number_or_null(const std::optional<double>& v) { return v ? json(*v) : json(); }

std::string category(int k) { return std::string(mem_category_name(static_cast<MemCategory>(k))); }
constexpr int kLastStateCategory = static_cast<int>(MemCategory::kAdamV);

// Per-rank model-state bytes of the ZeRO paper's formula (train/plan.h), so the page can
// show how far the exact partitions are from it.
json zero_formula(double phi, int n, int stage, Precision precision) {
  const PaperStateBytes b = paper_model_state_bytes(phi, n, stage, precision);
  return {{"params", b.params}, {"grads", b.grads},   {"master", b.master},
          {"adam_m", b.adam_m}, {"adam_v", b.adam_v}, {"total", b.total()}};
}

// What a step's val_loss holds in the page's data when the report wrote null for it.
constexpr const char* kNonFinite = "non-finite";

// A curve's point for page.js: [step, loss (null: not finite), val_loss (null: not
// evaluated; kNonFinite: null in the report)]. The page counts a non-finite validation loss
// as not drawn, unlike a step that was not evaluated at all.
json point(const ReportStep& s) {
  // Steps are integers in every report zerodp writes, and stay integers on the page.
  const bool whole = s.step == std::floor(s.step) && std::abs(s.step) < 0x1p63;
  const json step = whole ? json(static_cast<int64_t>(s.step)) : json(s.step);
  json val;
  if (s.evaluated) val = s.val_loss ? json(*s.val_loss) : json(kNonFinite);
  return json::array({step, number_or_null(s.loss), val});
}

// How the run ended, for the runs table and the loss chart's markers: an early stop, or a
// --stop-after slice short of --steps (which the report does not count as a stop), and the
// elastic restarts on the way.
void add_ending(const RunReport& r, json& run) {
  if (r.stopped) {
    run["stopped"] = {{"reason", r.stopped->reason},
                      {"signal", r.stopped->signal ? json(*r.stopped->signal) : json()},
                      {"after_step", r.stopped->after_step},
                      {"message", r.stopped->message}};
  } else {
    run["stopped"] = json();
  }
  run["planned_steps"] = r.planned_steps ? json(*r.planned_steps) : json();
  run["stop_after"] = r.stop_after && *r.stop_after > 0 ? json(*r.stop_after) : json();
  run["restarts"] = json::array();
  for (const ReportRestart& x : r.restarts) {
    run["restarts"].push_back({{"failed_step", x.failed_step},
                               {"failed_rank", x.failed_rank ? json(*x.failed_rank) : json()},
                               {"cause", x.cause},
                               {"ranks_before", x.ranks_before},
                               {"ranks_after", x.ranks_after},
                               {"resumed_step", x.resumed_step},
                               {"order_note", x.order_note}});
  }
}

// Rank i's figures as the report's plan forecast them, beside the measured ones: null when
// the report has no plan.
void add_plan(const RunReport& r, size_t i, json& out) {
  if (!r.plan) {
    out["plan_states"] = json();
    out["plan_comm_per_step"] = json();
    out["plan_cross_per_step"] = json();
    out["plan_outer_per_step"] = json();
    out["plan_outer_cross_per_step"] = json();
    return;
  }
  const bool nodes = r.node_ranks.has_value();
  const double nsteps = static_cast<double>(r.steps.size());
  const ReportPlanRank& p = (*r.plan)[i];
  out["plan_states"] = {{"params", p.model_state.params}, {"grads", p.model_state.grads},
                        {"master", p.model_state.master}, {"adam_m", p.model_state.adam_m},
                        {"adam_v", p.model_state.adam_v}, {"total", p.model_state_total}};
  out["plan_comm_per_step"] = p.comm_bytes_per_step;
  out["plan_cross_per_step"] =
      nodes && p.comm_cross_node_bytes_per_step ? json(*p.comm_cross_node_bytes_per_step) : json();
  // The outer exchanges' bytes spread over the run's steps, as the ledger spread them:
  // the inner step's formula alone sits below the measured bars by this much.
  const bool outer = p.comm_bytes_outer_steps && !r.steps.empty();
  out["plan_outer_per_step"] =
      outer ? json(static_cast<double>(*p.comm_bytes_outer_steps) / nsteps) : json();
  out["plan_outer_cross_per_step"] =
      outer && nodes && p.comm_cross_node_bytes_outer_steps
          ? json(static_cast<double>(*p.comm_cross_node_bytes_outer_steps) / nsteps)
          : json();
}

// Rank i's measured model states, peaks and comm per step, and the plan's forecast of them.
json rank_data(const RunReport& r, size_t i) {
  // Only a run over nodes has bytes crossing them to draw: on one node they are all 0.
  const bool nodes = r.node_ranks.has_value();
  const double nsteps = static_cast<double>(r.steps.size());
  const ReportRank& rank = r.ranks[i];
  json out;
  out["rank"] = rank.rank;
  uint64_t total = 0;
  for (int k = 0; k <= kLastStateCategory; ++k) {
    out["states"][category(k)] = rank.model_state[k];
    total += rank.model_state[k];
  }
  out["states_total"] = total;
  for (int k = kLastStateCategory + 1; k < kNumMemCategories; ++k) {
    out["peaks"][category(k)] = rank.peak[k];
  }
  out["peak_total"] = rank.peak_total;
  out["nvme"] = rank.nvme_bytes;
  json per_step = json::object();
  for (const auto& [kind, bytes] : rank.comm_bytes) {
    per_step[kind] = static_cast<double>(bytes) / nsteps;
  }
  out["comm_per_step"] = r.steps.empty() ? json() : per_step;
  // null for a run on one node, and where the report has no cross_node_bytes (written
  // before the ledger counted them).
  json cross_per_step = json::object();
  for (const auto& [kind, bytes] : rank.comm_cross_node_bytes) {
    cross_per_step[kind] = static_cast<double>(bytes) / nsteps;
  }
  const bool cross = nodes && !r.steps.empty() && !rank.comm_cross_node_bytes.empty();
  out["cross_per_step"] = cross ? cross_per_step : json();
  add_plan(r, i, out);
  return out;
}

json run_data(const RunReport& r, const std::string& file) {
  json run;
  run["label"] = file;
  run["params"] = r.params;
  run["world_size"] = r.world_size;
  run["stage"] = r.stage;
  run["precision"] = std::string(precision_name(r.precision));
  run["backend"] = r.backend;
  run["data"] = r.data;
  run["resumed_from"] = r.resumed_from ? json(*r.resumed_from) : json();
  if (r.model) run["model"] = r.model->model + (r.model->size ? " " + *r.model->size : "");
  run["final_loss"] = number_or_null(r.final_loss);
  run["final_val_loss"] = number_or_null(r.final_val_loss);
  run["weights_sha256"] = r.weights_sha256;
  run["tokens_per_second"] = number_or_null(r.tokens_per_second);
  run["mfu"] = number_or_null(r.mfu);
  // A continuation's curve starts at step 1: the steps its checkpoint carried, then its
  // own. The step count and the comm per step stay this run's, the steps its ledgers
  // measured.
  run["steps"] = json::array();
  for (const ReportStep& s : r.history) run["steps"].push_back(point(s));
  for (const ReportStep& s : r.steps) run["steps"].push_back(point(s));
  run["step_count"] = r.steps.size();
  // DiLoCo's outer steps (--islands), ticked on the loss chart.
  run["outer_steps"] = json::array();
  for (const auto* list : {&r.history, &r.steps}) {
    for (const ReportStep& s : *list) {
      if (s.outer) run["outer_steps"].push_back(point(s)[0]);
    }
  }
  add_ending(r, run);
  run["node_ranks"] = r.node_ranks ? json(*r.node_ranks) : json();
  // DiLoCo's islands: ZeRO shards inside each, so the formula divides by an island's ranks.
  run["islands"] = r.islands;
  run["shard_ranks"] = r.shard_ranks;
  run["ranks"] = json::array();
  for (size_t i = 0; i < r.ranks.size(); ++i) run["ranks"].push_back(rank_data(r, i));
  run["formula"] = zero_formula(static_cast<double>(r.params), r.shard_ranks, r.stage, r.precision);
  return run;
}

json metrics_data(const std::vector<ReportStep>& steps, const std::string& file) {
  json points = json::array();
  for (const ReportStep& s : steps) points.push_back(point(s));
  return {{"label", file}, {"steps", points}};
}

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

// JSON for inside <script>: '<', '>' and '&' occur only in strings, where \u escapes mean
// the same characters, so no input ("</script>", "<!--") can end the element early.
// Bytes that are not UTF-8 (a path can hold any) become U+FFFD instead of failing.
std::string script_json(const json& j) {
  const std::string raw = j.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out;
  out.reserve(raw.size());
  for (char ch : raw) {
    switch (ch) {
      case '<':
        out += "\\u003c";
        break;
      case '>':
        out += "\\u003e";
        break;
      case '&':
        out += "\\u0026";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

// Replaces each @@NAME@@ of the template once, without rescanning what was put in, so no
// input can smuggle in a placeholder.
std::string fill(std::string_view page, const std::vector<std::pair<std::string, std::string>>& v) {
  std::string out;
  size_t pos = 0;
  while (true) {
    const auto open = page.find("@@", pos);
    if (open == std::string_view::npos) break;
    const auto close = page.find("@@", open + 2);
    if (close == std::string_view::npos) break;
    const std::string_view name = page.substr(open + 2, close - open - 2);
    out.append(page.substr(pos, open - pos));
    bool found = false;
    for (const auto& [k, text] : v) {
      if (k == name) {
        out += text;
        found = true;
      }
    }
    if (!found) out.append(page.substr(open, close + 2 - open));
    pos = close + 2;
  }
  out.append(page.substr(pos));
  return out;
}

int run_report(const Flags& f) {
  // Before anything is read: every input can be read to its end, and the page never
  // replaces a file it is made from.
  std::vector<files::Named> inputs;
  for (const auto& p : f.reports) {
    check_input("report", p);
    inputs.push_back({"report", p});
  }
  for (const auto& p : f.metrics) {
    check_input("metrics", p);
    inputs.push_back({"--metrics", p});
  }
  const files::Named out[] = {{"--out", f.out}};
  files::check_distinct(inputs, out);
  json data;
  data["runs"] = json::array();
  data["metrics"] = json::array();
  for (const auto& p : f.reports) data["runs"].push_back(run_data(read_report(p), p));
  for (const auto& p : f.metrics) data["metrics"].push_back(metrics_data(read_metrics(p), p));
  std::string title = f.title;
  if (title.empty()) {
    title = "zerodp report: ";
    if (f.reports.size() <= 4) {
      for (size_t i = 0; i < f.reports.size(); ++i) title += (i ? ", " : "") + f.reports[i];
    } else {
      title += fmt::format("{} runs", f.reports.size());
    }
  }
  data["title"] = title;
  // The title is HTML text here; replacement keeps a non-UTF-8 title from breaking the page.
  const std::string safe_title = json(title).dump(-1, ' ', false, json::error_handler_t::replace);
  const std::string page =
      fill(kReportPage, {{"TITLE", html_escape(json::parse(safe_title).get<std::string>())},
                         {"VERSION", html_escape(zerodp_version())},
                         {"DATA", script_json(data)}});
  files::write_output("--out", f.out, page);
  if (!f.quiet) {
    fmt::print(stderr, "zerodp report: {} run{}{} -> {} ({})\n", f.reports.size(),
               f.reports.size() == 1 ? "" : "s",
               f.metrics.empty() ? "" : fmt::format(", {} metrics log(s)", f.metrics.size()), f.out,
               format_bytes(static_cast<double>(page.size())));
  }
  return 0;
}

}  // namespace

Runner add_report(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  app.add_option("RUN", f->reports, "Run reports (zerodp train --report FILE), one or more")
      ->required();
  app.add_option("--metrics", f->metrics,
                 "--metrics logs (zerodp train --metrics FILE) to draw as more loss curves");
  app.add_option("--out", f->out, "The HTML file to write")->required();
  app.add_option("--title", f->title, "The page's title (default: the run files)");
  app.add_flag("--quiet", f->quiet, "Print nothing on success");
  app.footer(
      "One self-contained HTML page (no network: inline CSS and script, SVG charts): loss\n"
      "curves, per-rank memory by category, comm bytes per step by collective (hatched:\n"
      "the part crossing nodes, for runs with --node-ranks), and model states measured\n"
      "against the ZeRO formula (docs/report.md).\n"
      "Examples:\n"
      "  zerodp train --stage 0 --report s0.json && zerodp train --stage 3 --report s3.json\n"
      "  zerodp report s0.json s3.json --out stages.html\n"
      "  zerodp report run.json --metrics live.jsonl --out run.html --title 'stage 3, 4 ranks'");
  return [f](Launch) { return run_report(*f); };
}

}  // namespace zerodp::cli
