// zerodp report: run reports (docs/report.md) and --metrics logs as one self-contained HTML
// page: loss curves, per-rank memory by category, comm per step by collective, and model
// states measured against the ZeRO formula. The page loads nothing (inline CSS, an inline
// script drawing SVG), so it can be attached to an issue or kept as a CI artifact and still
// open years later without network. Everything the script needs is checked here, so a bad
// input is refused with a message naming the file and key instead of a half-drawn page.
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
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
#include "report_page.h"  // generated from report/page.{html,css,js} (cli/CMakeLists.txt)
#include "train/config.h"
#include "train/plan.h"

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

const char* const kStateCats[] = {"params", "grads", "master", "adam_m", "adam_v"};
const char* const kPeakCats[] = {"gathered", "grad_buckets", "activations", "comm_buffers",
                                 "workspace"};

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

std::string read_input(const std::string& what, const std::string& path) {
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
  return j.is_object() && j.contains("step") && j.contains("loss") && !j.contains("ranks");
}

// Reads a report's keys; every refusal names the file and the key's path in the report.
class Report {
 public:
  explicit Report(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void bad(const std::string& key, const std::string& what) const {
    throw InvalidArgument(
        fmt::format("report '{}' is not a zerodp train report: '{}' {}", file_, key, what));
  }
  const json& at(const json& obj, const std::string& path, const char* key) const {
    if (!obj.is_object() || !obj.contains(key)) bad(join(path, key), "is missing");
    return obj.at(key);
  }
  const json& object(const json& obj, const std::string& path, const char* key) const {
    const json& v = at(obj, path, key);
    if (!v.is_object()) bad(join(path, key), "is not an object");
    return v;
  }
  const json& array(const json& obj, const std::string& path, const char* key) const {
    const json& v = at(obj, path, key);
    if (!v.is_array()) bad(join(path, key), "is not an array");
    return v;
  }
  double number(const json& obj, const std::string& path, const char* key) const {
    const json& v = at(obj, path, key);
    if (!v.is_number()) bad(join(path, key), "is not a number");
    return v.get<double>();
  }
  // JSON null stands for a missing or non-finite value (the writer's convention).
  std::optional<double> number_or_null(const json& obj, const std::string& path,
                                       const char* key) const {
    if (!obj.contains(key) || obj.at(key).is_null()) return std::nullopt;
    return number(obj, path, key);
  }
  uint64_t count(const json& obj, const std::string& path, const char* key) const {
    const json& v = at(obj, path, key);
    // The parser reads every non-negative integer as unsigned.
    if (!v.is_number_unsigned()) bad(join(path, key), "is not a non-negative integer");
    return v.get<uint64_t>();
  }
  std::string string(const json& obj, const std::string& path, const char* key) const {
    const json& v = at(obj, path, key);
    if (!v.is_string()) bad(join(path, key), "is not a string");
    return v.get<std::string>();
  }

 private:
  static std::string join(const std::string& path, const char* key) {
    return path.empty() ? std::string(key) : path + "." + key;
  }
  std::string file_;
};

// Per-rank model-state bytes of the ZeRO paper's formula (train/plan.h), so the page can
// show how far the exact partitions are from it.
json zero_formula(double phi, int n, int stage, const std::string& precision) {
  const PaperStateBytes b = paper_model_state_bytes(phi, n, stage, *parse_precision(precision));
  return {{"params", b.params}, {"grads", b.grads},   {"master", b.master},
          {"adam_m", b.adam_m}, {"adam_v", b.adam_v}, {"total", b.total()}};
}

// What a step's val_loss holds in the page's data when the report wrote null for it.
constexpr const char* kNonFinite = "non-finite";

json steps_data(const json& steps, const std::string& where,
                const std::function<void(const std::string&, const std::string&)>& bad) {
  json out = json::array();
  for (size_t i = 0; i < steps.size(); ++i) {
    const json& s = steps[i];
    const std::string at = fmt::format("{}[{}]", where, i);
    if (!s.is_object()) bad(at, "is not an object");
    if (!s.contains("step") || !s["step"].is_number())
      bad(at + ".step", "is missing or not a number");
    if (!s.contains("loss") || !(s["loss"].is_number() || s["loss"].is_null())) {
      bad(at + ".loss", "is missing or not a number");
    }
    json val;
    if (s.contains("val_loss")) {
      if (!(s["val_loss"].is_number() || s["val_loss"].is_null())) {
        bad(at + ".val_loss", "is not a number");
      }
      // The writer turns a non-finite loss into null; the page counts those as not drawn,
      // unlike a step that was not evaluated at all.
      val = s["val_loss"].is_null() ? json(kNonFinite) : s["val_loss"];
    }
    out.push_back(json::array({s["step"], s["loss"], val}));
  }
  return out;
}

json run_data(const json& root, const std::string& file) {
  if (!root.is_object() || looks_like_step(root)) {
    throw InvalidArgument(fmt::format(
        "report '{}' is not a zerodp train report: it holds {}", file,
        looks_like_step(root) ? "one step record; pass a --metrics log with --metrics"
                              : fmt::format("a JSON {}, not an object", root.type_name())));
  }
  const Report R(file);
  json run;
  run["label"] = file;
  R.string(root, "", "zerodp_version");  // the mark of a report
  const uint64_t phi = R.count(root, "", "params");
  const uint64_t world = R.count(root, "", "world_size");
  const uint64_t stage = R.count(root, "", "stage");
  if (world < 1 || world > (1u << 20)) R.bad("world_size", fmt::format("is {}", world));
  if (stage > 3) R.bad("stage", fmt::format("is {}; stages are 0..3", stage));
  const std::string precision = R.string(root, "", "precision");
  if (precision != "bf16" && precision != "fp16" && precision != "fp32") {
    R.bad("precision", fmt::format("is '{}'; expected bf16, fp16 or fp32", precision));
  }
  run["params"] = phi;
  run["world_size"] = world;
  run["stage"] = stage;
  run["precision"] = precision;
  run["backend"] = R.string(root, "", "backend");
  run["data"] = root.contains("data") && root["data"].is_string() ? root["data"] : json("");
  run["resumed_from"] = root.contains("resumed_from") && root["resumed_from"].is_string()
                            ? root["resumed_from"]
                            : json();
  if (root.contains("config") && root["config"].is_object()) {
    const json& c = root["config"];
    std::string model = c.value("model", "");
    if (c.contains("size") && c["size"].is_string()) model += " " + c["size"].get<std::string>();
    run["model"] = model;
  }

  const json& final = R.object(root, "", "final");
  const auto final_loss = R.number_or_null(final, "final", "loss");
  const auto final_val = R.number_or_null(final, "final", "val_loss");
  run["final_loss"] = final_loss ? json(*final_loss) : json();
  run["final_val_loss"] = final_val ? json(*final_val) : json();
  run["weights_sha256"] = R.string(final, "final", "weights_sha256");
  const json& tp = R.object(root, "", "throughput");
  const auto tps = R.number_or_null(tp, "throughput", "tokens_per_second");
  run["tokens_per_second"] = tps ? json(*tps) : json();
  const auto mfu = R.number_or_null(tp, "throughput", "mfu");
  run["mfu"] = mfu ? json(*mfu) : json();

  const json& steps = R.array(root, "", "steps");
  const auto bad = [&](const std::string& k, const std::string& w) { R.bad(k, w); };
  // A continuation's curve starts at step 1: the steps its checkpoint carried ("history",
  // absent from reports of earlier versions), then its own. The step count and the comm
  // per step stay this run's, the steps its ledgers measured.
  run["steps"] = root.contains("history") ? steps_data(R.array(root, "", "history"), "history", bad)
                                          : json::array();
  for (json& p : steps_data(steps, "steps", bad)) run["steps"].push_back(std::move(p));
  run["step_count"] = steps.size();

  // The plan is newer than the report format; older reports simply lack it.
  const json* plan_states = nullptr;
  const json* plan_comm = nullptr;
  if (root.contains("plan")) {
    const json& plan = R.object(root, "", "plan");
    plan_states = &R.array(plan, "plan", "model_state_bytes");
    plan_comm = &R.array(plan, "plan", "comm_bytes_per_step");
    if (plan_states->size() != world || plan_comm->size() != world) {
      R.bad("plan", fmt::format("does not have one entry per rank (world_size {})", world));
    }
  }

  const json& ranks = R.array(root, "", "ranks");
  if (ranks.size() != world) {
    R.bad("ranks", fmt::format("has {} entries for world_size {}", ranks.size(), world));
  }
  const double nsteps = static_cast<double>(steps.size());
  run["ranks"] = json::array();
  for (size_t i = 0; i < ranks.size(); ++i) {
    const std::string where = fmt::format("ranks[{}]", i);
    const json& rk = ranks[i];
    if (!rk.is_object()) R.bad(where, "is not an object");
    json r;
    r["rank"] = R.count(rk, where, "rank");
    const json& states = R.object(rk, where, "model_state_bytes");
    const json& peaks = R.object(rk, where, "peak_bytes");
    uint64_t total = 0;
    for (const char* c : kStateCats) {
      const uint64_t b = R.count(states, where + ".model_state_bytes", c);
      r["states"][c] = b;
      total += b;
    }
    r["states_total"] = total;
    for (const char* c : kPeakCats) r["peaks"][c] = R.count(peaks, where + ".peak_bytes", c);
    r["peak_total"] = R.count(peaks, where + ".peak_bytes", "total");
    const json& comm = R.object(rk, where, "comm");
    json per_step = json::object();
    for (const auto& [kind, v] : comm.items()) {
      const double bytes =
          static_cast<double>(R.count(v, fmt::format("{}.comm.{}", where, kind), "bytes"));
      per_step[kind] = bytes / nsteps;
    }
    r["comm_per_step"] = steps.empty() ? json() : per_step;
    if (plan_states != nullptr) {
      const std::string ps = fmt::format("plan.model_state_bytes[{}]", i);
      const json& s = (*plan_states)[i];
      for (const char* c : kStateCats) r["plan_states"][c] = R.count(s, ps, c);
      r["plan_states"]["total"] = R.count(s, ps, "total");
      r["plan_comm_per_step"] =
          R.count((*plan_comm)[i], fmt::format("plan.comm_bytes_per_step[{}]", i), "total");
    } else {
      r["plan_states"] = json();
      r["plan_comm_per_step"] = json();
    }
    run["ranks"].push_back(r);
  }
  run["formula"] = zero_formula(static_cast<double>(phi), static_cast<int>(world),
                                static_cast<int>(stage), precision);
  return run;
}

json load_report(const std::string& path) {
  const std::string text = read_input("report", path);
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    // A JSON-lines log parses line by line: say what it is instead of "not JSON".
    const auto nl = text.find('\n');
    const json first = json::parse(text.substr(0, nl), nullptr, false);
    if (!first.is_discarded() && looks_like_step(first)) {
      throw InvalidArgument(fmt::format(
          "report '{}' is a --metrics log (one JSON line per step), not a report; pass it "
          "with --metrics",
          path));
    }
    throw CorruptData(fmt::format("report '{}' is not valid JSON: {}", path, parse_message(e)));
  }
  return run_data(root, path);
}

// A --metrics log: one step record (step_json) per line. A last line without its newline
// is a write in progress (the trainer writes a line, then flushes) and is left out, so a
// page can be made of a run that is still going.
json load_metrics(const std::string& path) {
  const std::string text = read_input("metrics", path);
  const json whole = json::parse(text, nullptr, false);
  if (!whole.is_discarded() && whole.is_object() && whole.contains("zerodp_version")) {
    throw InvalidArgument(fmt::format(
        "metrics '{}' is a run report, not a --metrics log; pass it without --metrics", path));
  }
  json steps = json::array();
  size_t pos = 0;
  int line = 0;
  while (pos < text.size()) {
    const auto nl = text.find('\n', pos);
    const bool complete = nl != std::string::npos;
    const std::string row = text.substr(pos, complete ? nl - pos : std::string::npos);
    pos = complete ? nl + 1 : text.size();
    ++line;
    if (row.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(row);
    } catch (const json::parse_error& e) {
      if (!complete) break;
      throw CorruptData(
          fmt::format("metrics '{}' line {} is not valid JSON: {}", path, line, parse_message(e)));
    }
    if (!looks_like_step(j)) {
      throw InvalidArgument(fmt::format(
          "metrics '{}' line {} is not a zerodp step record (no 'step' and 'loss')", path, line));
    }
    json one = json::array({j});
    steps.push_back(steps_data(one, "", [&](const std::string& k, const std::string& w) {
      throw InvalidArgument(
          fmt::format("metrics '{}' line {}: '{}' {}", path, line, k.substr(k.find('.') + 1), w));
    })[0]);
  }
  return {{"label", path}, {"steps", steps}};
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
  for (const auto& p : f.reports) data["runs"].push_back(load_report(p));
  for (const auto& p : f.metrics) data["metrics"].push_back(load_metrics(p));
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
      "curves, per-rank memory by category, comm bytes per step by collective, and model\n"
      "states measured against the ZeRO formula (docs/report.md).\n"
      "Examples:\n"
      "  zerodp train --stage 0 --report s0.json && zerodp train --stage 3 --report s3.json\n"
      "  zerodp report s0.json s3.json --out stages.html\n"
      "  zerodp report run.json --metrics live.jsonl --out run.html --title 'stage 3, 4 ranks'");
  return [f](Launch) { return run_report(*f); };
}

}  // namespace zerodp::cli
