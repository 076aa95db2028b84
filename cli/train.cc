// zerodp train: a data-parallel training run at any ZeRO stage, with a report.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <set>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "core/files.h"
#include "core/units.h"
#include "options.h"
#include "train/engine.h"
#include "train/report.h"
#include "train/stop.h"

namespace zerodp::cli {
namespace {

struct Flags {
  TrainConfig cfg;
  OptionTexts texts;
  std::string config_file;  // main() has expanded it; kept for --help and CLI11's check
};

// The --config file named on the command line, if any (main() has already expanded it).
std::string config_file_of(const Launch& args) {
  for (int i = 1; i < args.argc; ++i) {
    const std::string_view a = args.argv[i];
    if (a == "--config" && i + 1 < args.argc) return args.argv[i + 1];
    if (a.starts_with("--config=")) return std::string(a.substr(9));
  }
  return {};
}

class Progress {
 public:
  explicit Progress(bool enabled)
      : enabled_(enabled), tty_(enabled && isatty(fileno(stderr)) != 0) {}

  void operator()(const StepRecord& s, int64_t total) {
    if (!enabled_) return;
    tokens_ += s.tokens;
    seconds_ += s.seconds;
    ++done_;
    const double tps = seconds_ > 0 ? static_cast<double>(tokens_) / seconds_ : 0;
    // A continuation starts past step 1: the rate is this run's.
    const double eta = seconds_ / static_cast<double>(done_) * static_cast<double>(total - s.step);
    std::string line = fmt::format("step {:>{}}/{} loss {:.4f} lr {:.2e} norm {:.3f} {:.0f} tok/s",
                                   s.step, digits(total), total, s.loss, s.lr, s.grad_norm, tps);
    if (s.mfu) line += fmt::format(" mfu {:.0f}%", 100 * *s.mfu);
    if (s.loss_scale) line += fmt::format(" scale {:g}", *s.loss_scale);
    if (s.skipped) line += " [skipped]";
    if (s.val_loss) line += fmt::format(" val {:.4f}", *s.val_loss);
    if (tty_) {
      const int width = 24;
      const int filled = static_cast<int>(width * s.step / total);
      fmt::print(stderr, "\r[{}{}] {} ETA {:.0f}s   ", std::string(filled, '#'),
                 std::string(width - filled, '.'), line, eta);
      if (s.step == total) fmt::print(stderr, "\n");
    } else {
      const int64_t every = std::max<int64_t>(1, total / 20);
      if (s.step == 1 || s.step % every == 0 || s.step == total || s.val_loss) {
        fmt::print(stderr, "{}\n", line);
      }
    }
    std::fflush(stderr);
  }

  // A line of its own that the progress bar does not overwrite.
  void note(const std::string& text) {
    if (enabled_) say(text);
  }

  // Printed with --no-progress too: what changes the run's course is never silent.
  void say(const std::string& text) {
    if (tty_) {
      fmt::print(stderr, "\r{:<100}\n", text);
    } else {
      fmt::print(stderr, "{}\n", text);
    }
    std::fflush(stderr);
  }

 private:
  static int digits(int64_t n) { return static_cast<int>(std::to_string(n).size()); }
  bool enabled_;
  bool tty_;
  uint64_t tokens_ = 0;
  double seconds_ = 0;
  int64_t done_ = 0;
};

// The --metrics log (none for an empty path), appended line by line as steps end, so it is
// written in place (through a link to its target) rather than replaced at the end; train()
// has checked it can be written. Opened at the first step, closed with the object.
class MetricsLog {
 public:
  explicit MetricsLog(const std::string& path) : path_(path) {}
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  ~MetricsLog() {
    if (fd_ >= 0) ::close(fd_);
  }

  void append(const StepRecord& s) {
    if (path_.empty()) return;
    if (fd_ < 0) fd_ = files::open_in_place("--metrics", path_, O_WRONLY | O_CREAT | O_TRUNC);
    const std::string line = step_json(s).dump() + "\n";
    for (size_t done = 0; done < line.size();) {
      const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        throw IoError(fmt::format("--metrics: cannot write '{}': {}", path_,
                                  std::strerror(n == 0 ? ENOSPC : errno)));
      }
      done += static_cast<size_t>(n);
    }
  }

 private:
  const std::string& path_;
  int fd_ = -1;
};

// 128 + the signal for a run a signal stopped (also one that arrived after the last step:
// the caller asked to stop and should learn that it did), 1 for --max-skips, else 0.
// A run whose every step was skipped trained nothing: 1 as well, since the weights it
// reports are the ones it started from.
int exit_code(const TrainResult& r) {
  if (r.stopped && r.stopped->reason != EarlyStop::Reason::kSignal) return kExitFailure;
  if (r.stopped) return 128 + r.stopped->signal;
  if (const int signal = stop_requested()) return 128 + signal;
  if (!r.steps.empty() && std::ranges::all_of(r.steps, &StepRecord::skipped)) return kExitFailure;
  return 0;
}

// The run's skipped steps, said once at the end: a loss of nan or a flat curve has a
// cause the user should not have to dig out of the step lines. Empty when none was skipped.
std::string skips_note(const TrainResult& r) {
  const auto first = std::ranges::find_if(r.steps, &StepRecord::skipped);
  if (first == r.steps.end()) return {};
  const auto skipped = std::ranges::count_if(r.steps, &StepRecord::skipped);
  const std::string where =
      first->bad_unit.empty() ? std::string("the loss")
                              : fmt::format("unit {} on rank {}", first->bad_unit, first->bad_rank);
  if (skipped == static_cast<std::ptrdiff_t>(r.steps.size())) {
    return fmt::format(
        "no step trained: all {} were skipped for non-finite gradients or loss (the first, "
        "step {}, in {}), so the weights are the ones the run started from; check the "
        "starting weights (--init-from), lower --lr, or use --precision fp32",
        skipped, first->step, where);
  }
  return fmt::format(
      "{} of {} steps were skipped for non-finite gradients or loss (the first, step {}, in "
      "{}); their updates were not applied",
      skipped, r.steps.size(), first->step, where);
}

// What an early stop left behind, and how to go on.
std::string stop_note(const TrainResult& r) {
  const EarlyStop& stop = *r.stopped;
  if (stop.reason == EarlyStop::Reason::kMaxSkips) return stop.message;
  if (stop.reason == EarlyStop::Reason::kCheckpointFailed) {
    std::string note = fmt::format("stopped: {}", stop.message);
    if (!r.config.report_path.empty()) note += fmt::format("; report: {}", r.config.report_path);
    return note;
  }
  std::string note = fmt::format("interrupted by {} after step {} of {}", signal_name(stop.signal),
                                 stop.after_step, r.config.steps);
  std::string saved;
  for (auto s = r.steps.rbegin(); s != r.steps.rend() && saved.empty(); ++s) saved = s->checkpoint;
  if (r.saves.abandoned) {
    note += fmt::format(
        "; the save of step {} was still being written after --checkpoint-signal-wait {:g}s "
        "and was abandoned",
        *r.saves.abandoned, r.config.checkpoint_signal_wait);
  }
  if (!saved.empty()) {
    note += fmt::format("; checkpoint committed: {} (continue with --resume latest)", saved);
  } else if (r.saves.abandoned) {
    note += "; no checkpoint committed by this run";
  } else {
    note += "; no checkpoint (pass --checkpoint-dir DIR to save on interrupt)";
  }
  if (!r.config.report_path.empty()) note += fmt::format("; report: {}", r.config.report_path);
  return note;
}

// What the reporting rank prints when the run ends: what it trained, its losses, rate and
// MFU, the tables, the command line's --report (`report_path`), and on stderr how an early
// stop or skipped steps left it.
void print_summary(const TrainResult& r, const std::string& report_path) {
  fmt::print("{}\n", r.data_description);
  const std::string islands =
      r.config.islands < 2 ? ""
      : r.config.islands_in_turn
          ? fmt::format(" holding {} islands in turn", r.config.islands)
          : fmt::format(" as {} islands of {}", r.config.islands, r.world_size / r.config.islands);
  fmt::print("trained {} parameters for {} steps: stage {}, {} ranks{} ({}), {}\n", r.params,
             r.steps.size(), r.config.stage, r.world_size, islands, r.backend,
             precision_name(r.config.precision));
  if (!r.resumed_from.empty()) {
    fmt::print("continued from {}: steps {}..{}\n", r.resumed_from, r.first_step, r.config.steps);
  }
  if (!r.order_note.empty()) fmt::print(stderr, "zerodp: note: {}\n", r.order_note);
  if (!r.init_sha256.empty()) {
    fmt::print("started from {} (sha256 {})\n", r.config.init_from, r.init_sha256.substr(0, 16));
  }
  if (r.steps.empty()) {
    // --steps 0 (or a continuation with nothing left): no loss, rate or MFU to give.
    fmt::print("no step trained; validation loss {}, weights sha256 {}\n",
               r.val_loss ? fmt::format("{:.4f}", *r.val_loss) : "n/a",
               r.weights_sha256.substr(0, 16));
    if (!report_path.empty()) fmt::print("report: {}\n", report_path);
    return;
  }
  fmt::print("final loss {:.4f}, validation loss {}{}, {:.0f} tokens/s, weights sha256 {}\n",
             r.final_loss, r.val_loss ? fmt::format("{:.4f}", *r.val_loss) : "n/a",
             r.val_bits_per_byte ? fmt::format(" ({:.4f} bits/byte)", *r.val_bits_per_byte) : "",
             r.tokens_per_second, r.weights_sha256.substr(0, 16));
  // What proves no sample skipped or repeated across stops and rank counts: compare it.
  fmt::print("samples of steps {}..{} chained: sha256 {}\n", r.samples_chain_from + 1,
             r.steps.back().step, r.samples_chain.substr(0, 16));
  // Both denominators, calibrated at start-up: 512^3, and the model's own products (a
  // caller's model declares none).
  const std::string model_shapes =
      r.peak_flops_model_shapes && r.mfu_model_shapes
          ? fmt::format("{:.1f}% of a {:.1f} GFLOP/s peak on the model's own GEMM shapes",
                        100 * *r.mfu_model_shapes, *r.peak_flops_model_shapes / 1e9)
          : std::string("no model-shape peak (the model declares no GEMM shapes)");
  fmt::print(
      "MFU {:.1f}%: {:.3g} FLOPs/token x {:.0f} tokens/s over a {:.1f} GFLOP/s {} GEMM "
      "peak (512^3, calibrated at start-up); {}\n",
      100 * r.mfu, r.flops_per_token, r.tokens_per_second, r.peak_flops / 1e9,
      // The products' precision: bf16 runs multiply in bf16, fp16 runs in fp32.
      r.config.precision == Precision::kBF16 ? "bf16" : "fp32", model_shapes);
  fmt::print("{}", summary_table(r));
  fmt::print("{}", formula_table(r));
  if (!report_path.empty()) fmt::print("report: {}\n", report_path);
  if (r.stopped) fmt::print(stderr, "zerodp: {}\n", stop_note(r));
  if (const std::string skips = skips_note(r); !skips.empty()) {
    fmt::print(stderr, "zerodp: {}\n", skips);
  }
}

int run_train(Flags& f, Launch args) {
  TrainConfig& c = f.cfg;
  // A command line's policy is the stage's unless given, once the micro-batches per step are
  // known (a resume may derive them).
  c.accumulate_default = true;
  c.given = read_table_options(f.texts, c, kTrainCommand);
  c.launch.mpi_exit_code = exit_code_for;
  // Under mpirun the job's size is the world, unless --ranks was given to check it.
  if (c.launch.backend == Backend::kMpi && c.given->count("ranks") == 0) c.launch.ranks = 0;
  c.config_file = config_file_of(args);

  MetricsLog metrics(c.metrics_path);
  Progress progress(c.progress);
  int restarts = 0;
  StepCallback on_step = [&](const StepRecord& s, int64_t total) {
    metrics.append(s);
    progress(s, total);
    if (!s.checkpoint.empty() && c.progress) {
      progress.note(fmt::format("step {}: checkpoint committed: {}", s.step, s.checkpoint));
    }
  };
  // The survivors' launch prints its own steps from the checkpoint on.
  RestartCallback on_restart = [&](const Restart& x) {
    progress.say(fmt::format(
        "{} failed at step {} ({}); restarting on {} ranks x --grad-accum {} from the checkpoint "
        "of step {} (restart {} of --max-restarts {}){}",
        x.failed_rank >= 0 ? fmt::format("rank {}", x.failed_rank) : std::string("a rank"),
        x.failed_step, x.cause, x.ranks_after, x.grad_accum_after, x.resumed_step, ++restarts,
        c.max_restarts, x.order_note.empty() ? "" : "; " + x.order_note));
  };
  const StopOnSignals stop_on_signals;
  TrainResult r;
  try {
    r = train(c, args.argc, args.argv, on_step, {}, on_restart);
  } catch (const Interrupted& e) {
    fmt::print(stderr, "zerodp: {}\n", e.what());
    return 128 + e.signal();
  }
  const int code = exit_code(r);
  // Under mpirun a process ending non-zero makes the launcher kill the others, which could
  // cut rank 0 off while it writes the report; rank 0 alone carries the job's exit code.
  if (!r.is_reporter) return 0;
  print_summary(r, c.report_path);
  return code;
}

}  // namespace

Runner add_train(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  app.add_option("--config", f->config_file,
                 "JSON file of options (keys are flag names without --); flags given on the "
                 "command line win");
  add_table_options(app, kTrainCommand, f->texts, /*sections=*/true);
  return [f](Launch args) { return run_train(*f, args); };
}

}  // namespace zerodp::cli
