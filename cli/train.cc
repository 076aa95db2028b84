// zerodp train: a data-parallel training run at any ZeRO stage, with a report.
#include <unistd.h>

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
#include "train/engine.h"
#include "train/report.h"
#include "train/stop.h"

namespace zerodp::cli {
namespace {

struct Flags {
  TrainConfig cfg;
  std::string backend = "local";
  std::string precision = "bf16";
  std::string accumulate;  // empty = the stage's default
  std::string invariant = "auto";
  std::string memory_per_rank;
  std::string timeout = "300";
  std::string link_bandwidth;
  std::string inter_node_bandwidth;
  std::string inter_node_latency;
  std::string collectives = "flat";
  std::string qgz = "off";
  std::string offload = "none";
  std::string offload_piece = "0";
  std::string link_latency;
  std::string config_file;
  // Parsed here rather than by CLI11, to refuse what it would wrap, clamp or round to inf
  // and to quote the value as the user wrote it.
  std::string seed = "1337";
  std::string lr = "1e-3";
  std::string clip = "1";
  std::string weight_decay = "0.1";
  std::string warmup = "auto";
  bool no_progress = false;
  std::vector<std::string> inject;
  bool ranks_given = false;
  const CLI::Option* grad_accum_option = nullptr;
  // Shape overrides the user gave: 0 in TrainConfig means "the preset's", so a given 0 must
  // be told apart from none.
  std::vector<std::pair<std::string, const CLI::Option*>> shape_options;
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

// A finite number in [min, max] (max of fp32 by default: the engine holds these as float).
double parse_number(const std::string& text, std::string_view flag, double min, bool min_open,
                    std::string_view advice, double max = std::numeric_limits<float>::max()) {
  double v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  const bool ok = ec == std::errc() && ptr == end && std::isfinite(v) &&
                  (min_open ? v > min : v >= min) && v <= max;
  if (!ok) throw InvalidArgument(fmt::format("{} {} is invalid; {}", flag, text, advice));
  return v;
}

// A whole number as the user wrote it: CLI11 would wrap -1 into 2^64 - 1.
uint64_t parse_whole(const std::string& text, std::string_view flag, std::string_view advice) {
  uint64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end || text.empty()) {
    throw InvalidArgument(fmt::format("{} {} is invalid; {}", flag, text, advice));
  }
  return v;
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
    if (!enabled_) return;
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

// 128 + the signal for a run a signal stopped (also one that arrived after the last step:
// the caller asked to stop and should learn that it did), 1 for --max-skips, else 0.
int exit_code(const TrainResult& r) {
  if (r.stopped && r.stopped->reason != EarlyStop::Reason::kSignal) return kExitFailure;
  if (r.stopped) return 128 + r.stopped->signal;
  if (const int signal = stop_requested()) return 128 + signal;
  return 0;
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
  const std::string& saved = r.steps.empty() ? std::string() : r.steps.back().checkpoint;
  if (!saved.empty()) {
    note += fmt::format("; checkpoint committed: {} (continue with --resume latest)", saved);
  } else {
    note += "; no checkpoint (pass --checkpoint-dir DIR to save on interrupt)";
  }
  if (!r.config.report_path.empty()) note += fmt::format("; report: {}", r.config.report_path);
  return note;
}

int run_train(Flags& f, Launch args) {
  TrainConfig& c = f.cfg;
  const Backend backend = parse_backend_flag(f.backend);
  c.launch.backend = backend;
  c.launch.mpi_exit_code = exit_code_for;
  // Under mpirun the job's size is the world, unless --ranks was given to check it.
  if (backend == Backend::kMpi && !f.ranks_given) c.launch.ranks = 0;
  c.precision = parse_precision_flag(f.precision);
  (void)Sharding::for_stage(c.stage);
  if (f.grad_accum_option->count() > 0 && c.grad_accum < 1) {
    throw InvalidArgument(fmt::format("--grad-accum {} is invalid; use 1 or more", c.grad_accum));
  }
  // Both defaults wait for the micro-batches per step, which a resume may derive.
  c.accumulate_default = f.accumulate.empty();
  if (!f.accumulate.empty()) c.accumulate = parse_accumulate_flag(f.accumulate);
  c.invariant = parse_invariant_flag(f.invariant);
  c.launch.comm.two_level = parse_collectives_flag(f.collectives);
  c.launch.comm.qgz_bits = parse_qgz_flag(f.qgz);
  c.offload = parse_offload(f.offload);
  c.offload_piece = parse_whole(f.offload_piece, "--offload-piece",
                                "use a multiple of 1024 elements, e.g. 1048576, or 0 for the "
                                "default");
  c.launch.comm.timeout_seconds =
      parse_seconds(f.timeout, "--collective-timeout", 0, kCollectiveTimeoutMax);
  if (!(c.launch.comm.timeout_seconds > 0)) {
    throw InvalidArgument(fmt::format(
        "--collective-timeout '{}' is invalid; use a positive duration, e.g. 300 or 30s",
        f.timeout));
  }
  if (!f.memory_per_rank.empty()) {
    c.memory_per_rank = parse_bytes(f.memory_per_rank, "--memory-per-rank");
  }
  if (!f.link_bandwidth.empty()) {
    c.launch.comm.link_bandwidth = parse_bandwidth(
        f.link_bandwidth, "--link-bandwidth", kLinkBandwidthRange.min, kLinkBandwidthRange.max);
  }
  if (!f.link_latency.empty()) {
    c.launch.comm.link_latency = parse_seconds(f.link_latency, "--link-latency",
                                               kLinkLatencyRange.min, kLinkLatencyRange.max);
  }
  if (!f.inter_node_bandwidth.empty()) {
    c.launch.comm.inter_node_bandwidth =
        parse_bandwidth(f.inter_node_bandwidth, "--inter-node-bandwidth", kLinkBandwidthRange.min,
                        kLinkBandwidthRange.max);
  }
  if (!f.inter_node_latency.empty()) {
    c.launch.comm.inter_node_latency = parse_seconds(f.inter_node_latency, "--inter-node-latency",
                                                     kLinkLatencyRange.min, kLinkLatencyRange.max);
  }
  c.progress = !f.no_progress;
  for (const std::string& text : f.inject) c.inject.push_back(parse_injection(text));
  for (const auto& [flag, option] : f.shape_options) {
    const int v = flag == "--layers"  ? c.layers
                  : flag == "--heads" ? c.heads
                  : flag == "--embd"  ? c.embd
                                      : c.seq_len;
    if (option->count() > 0 && v < 1) {
      throw InvalidArgument(fmt::format(
          "{} {} is invalid; use 1 or more (omit it for the --size preset's)", flag, v));
    }
  }
  c.seed = parse_seed(f.seed, "--seed");
  c.lr = static_cast<float>(
      parse_number(f.lr, "--lr", 0, true, "use a positive number, e.g. 1e-3 or 3e-4"));
  c.clip = static_cast<float>(
      parse_number(f.clip, "--clip", 0, false, "use 0 (off) or a positive norm, e.g. 1.0"));
  c.weight_decay = static_cast<float>(parse_number(f.weight_decay, "--weight-decay", 0, false,
                                                   "use 0 (none) or a positive number, e.g. 0.1"));
  if (f.warmup == "auto") {
    c.warmup = -1;
  } else {
    c.warmup = static_cast<int64_t>(parse_number(
        f.warmup, "--warmup", 0, false,
        "use auto (5% of --steps with cosine) or a whole number of steps, e.g. 100", 1e15));
    if (std::to_string(c.warmup) != f.warmup) {
      throw InvalidArgument(fmt::format(
          "--warmup {} is invalid; use auto or a whole number of steps, e.g. 100", f.warmup));
    }
  }
  c.config_file = config_file_of(args);

  // A log, appended line by line as steps end, so it is written in place (through a link to
  // its target) rather than replaced at the end; train() has checked it can be written.
  std::unique_ptr<std::ofstream> metrics;
  Progress progress(c.progress);
  int restarts = 0;
  StepCallback on_step = [&](const StepRecord& s, int64_t total) {
    if (!c.metrics_path.empty()) {
      if (!metrics) {
        metrics = std::make_unique<std::ofstream>(c.metrics_path, std::ios::trunc);
      }
      *metrics << step_json(s).dump() << "\n";
      metrics->flush();
      if (!*metrics) {
        throw IoError(
            fmt::format("--metrics: cannot write '{}': {}", c.metrics_path, std::strerror(errno)));
      }
    }
    progress(s, total);
    if (!s.checkpoint.empty() && c.progress) {
      progress.note(fmt::format("step {}: checkpoint committed: {}", s.step, s.checkpoint));
    }
  };
  // The survivors' launch prints its own steps from the checkpoint on.
  RestartCallback on_restart = [&](const Restart& x) {
    progress.note(fmt::format(
        "{} failed at step {} ({}); restarting on {} ranks x --grad-accum {} from the checkpoint "
        "of step {} (restart {} of --max-restarts {})",
        x.failed_rank >= 0 ? fmt::format("rank {}", x.failed_rank) : std::string("a rank"),
        x.failed_step, x.cause, x.ranks_after, x.grad_accum_after, x.resumed_step, ++restarts,
        c.max_restarts));
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
  fmt::print("{}\n", r.data_description);
  fmt::print("trained {} parameters for {} steps: stage {}, {} ranks ({}), {}\n", r.params,
             r.steps.size(), r.config.stage, r.world_size, r.backend,
             precision_name(r.config.precision));
  if (!r.resumed_from.empty()) {
    fmt::print("continued from {}: steps {}..{}\n", r.resumed_from, r.first_step, r.config.steps);
  }
  fmt::print("final loss {:.4f}, validation loss {}, {:.0f} tokens/s, weights sha256 {}\n",
             r.final_loss, r.val_loss ? fmt::format("{:.4f}", *r.val_loss) : "n/a",
             r.tokens_per_second, r.weights_sha256.substr(0, 16));
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
  if (!c.report_path.empty()) fmt::print("report: {}\n", c.report_path);
  if (r.stopped) fmt::print(stderr, "zerodp: {}\n", stop_note(r));
  return code;
}

}  // namespace

// Checked as text (CLI11 validates before converting): an unsigned field would take -1 as
// 2^64 - 1, an int 2^32 + 1 as 1.
const CLI::Range kBlockRange(static_cast<int>(kQuantBlockRange.min),
                             static_cast<int>(kQuantBlockRange.max));

Runner add_train(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  TrainConfig& c = f->cfg;
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--config", f->config_file,
                 "JSON file of options (keys are flag names without --); flags given on the "
                 "command line win");
  auto* model = app.add_option_group("Model");
  model->add_option("--model", c.model, "gpt (byte-level language model) or mlp (Fashion-MNIST)")
      ->capture_default_str();
  model->add_option("--size", c.size, "GPT preset: tiny, small, medium, large")
      ->capture_default_str();
  f->shape_options = {
      {"--layers", model->add_option("--layers", c.layers, "GPT blocks (overrides the preset)")},
      {"--heads",
       model->add_option("--heads", c.heads, "GPT attention heads (overrides the preset)")},
      {"--embd", model->add_option("--embd", c.embd, "GPT embedding width (overrides the preset)")},
      {"--seq-len",
       model->add_option("--seq-len", c.seq_len, "GPT context length (overrides the preset)")}};
  model->add_option("--mlp-hidden", c.mlp_hidden, "MLP hidden width")->capture_default_str();
  model->add_option("--mlp-layers", c.mlp_layers, "MLP hidden layers")->capture_default_str();
  auto* data = app.add_option_group("Data");
  data->add_option("--data", c.data, "kjv, fashion-mnist, synthetic or a text file PATH")
      ->capture_default_str();
  data->add_option("--cache-dir", c.cache_dir,
                   "Where prepared data is cached (default ~/.cache/zerodp)");
  auto* par = app.add_option_group("Parallelism");
  CLI::Option* ranks =
      par->add_option("--ranks", c.launch.ranks, "Data-parallel ranks (local backend)")
          ->capture_default_str();
  par->add_option("--backend", f->backend, "local (threads) or mpi (under mpirun)")
      ->capture_default_str();
  par->add_option("--ranks-per-process", c.launch.ranks_per_process,
                  "mpi: ranks each process runs as threads, reading each other's buffers in "
                  "place; the world is mpirun's -np x this. Set it to --node-ranks to run one "
                  "process per node (docs/topology.md)")
      ->capture_default_str();
  par->add_option("--stage", c.stage, "ZeRO stage 0..3")->capture_default_str();
  par->add_option("--precision", f->precision, "bf16, fp16 (dynamic loss scaling) or fp32")
      ->capture_default_str();
  par->add_option("--micro-batch", c.micro_batch,
                  "Sequences per rank per micro-batch (default: the size preset's)")
      ->check(CLI::Range(1, 1 << 20));
  f->grad_accum_option = par->add_option(
      "--grad-accum", c.grad_accum,
      "Micro-batches per rank per optimizer step (default 1; on a resume, the checkpoint's "
      "micro-batches per step over --ranks, so the batch is kept)");
  par->add_option("--accumulate", f->accumulate,
                  "local (sum, reduce at the boundary) or reduce (every micro-batch, overlapping "
                  "backward); default reduce at stages 2-3 or with --grad-accum 1, else local");
  par->add_option("--invariant", f->invariant,
                  "on: sum gradients in the one order that gives the same bits for every rank "
                  "count dividing the micro-batches per step (needs --accumulate reduce; an "
                  "fp32 accumulator of 4 bytes per owned element when --grad-accum > 1); off; "
                  "auto: on under --accumulate reduce (docs/determinism.md)")
      ->capture_default_str();
  par->add_option("--initial-loss-scale", c.initial_loss_scale,
                  "fp16: the dynamic loss scale to start from (a power of two)")
      ->capture_default_str();
  par->add_flag("--checkpoint-activations", c.checkpoint_activations,
                "Keep only each unit's input in forward and recompute the unit in backward");
  par->add_option("--prefetch", c.prefetch, "Stage 3: units gathered ahead")->capture_default_str();
  par->add_option("--memory-per-rank", f->memory_per_rank, "Per-rank memory budget, e.g. 2GiB");
  par->add_option("--collective-timeout", f->timeout,
                  "A collective waiting longer fails, e.g. 300 or 30s")
      ->capture_default_str();
  par->add_option("--check-collectives", c.launch.comm.check_collectives,
                  "MPI: compare every collective's fingerprint across ranks first, so a "
                  "mismatch fails naming both ranks (on/off; the local backend always checks)")
      ->capture_default_str();
  par->add_option("--link-bandwidth", f->link_bandwidth,
                  "Simulate a network: each collective takes at least bytes / this, e.g. 1GB/s");
  par->add_option("--link-latency", f->link_latency,
                  "Simulated per-step latency of each collective's ring, e.g. 20us");
  par->add_option("--inter-node-bandwidth", f->inter_node_bandwidth,
                  "Simulate a slower link between nodes (needs --node-ranks): a flat "
                  "collective over several nodes runs at this rate, e.g. 1GB/s");
  par->add_option("--inter-node-latency", f->inter_node_latency,
                  "Simulated per-step latency between nodes (needs --node-ranks), e.g. 50us");
  par->add_option("--node-ranks", c.launch.comm.node_ranks,
                  "Ranks per node: consecutive ranks share a node, and the comm ledger counts "
                  "the bytes that cross nodes apart (docs/topology.md); default: one node");
  par->add_flag("--shard-within-node", c.shard_within_node,
                "Stages 1-3 with --node-ranks T: shard the states over the T ranks of each node "
                "and keep a replica per node (HSDP): gathers stay inside the node, gradients "
                "cross nodes once per reduction as an all-reduce of the shard; states cost "
                "1/T, not 1/N, per rank (docs/topology.md)");
  par->add_flag("--hpz", c.hpz,
                "Stage 3 with --node-ranks: keep each node's copy of a unit's parameters "
                "sharded over its ranks after the forward's gather, so the backward's gather "
                "stays inside the node (ZeRO++'s hpZ; costs the params' bytes / T per rank)");
  par->add_flag("--qwz", c.qwz,
                "Stage 3: gather parameters as int8 blocks with one fp32 scale each, quantized "
                "from the owner's fp32 master (ZeRO++'s qwZ): about half the gathers' bytes, "
                "and the passes see quantized weights");
  par->add_option("--qwz-block", c.qwz_block, "Elements per quantization scale (--qwz)")
      ->check(kBlockRange)
      ->capture_default_str();
  par->add_option("--offload", f->offload,
                  "optimizer: keep the fp32 master weights and Adam moments in a scratch file "
                  "per rank under --offload-dir, streamed through the update in 4 MiB pieces "
                  "(ZeRO-Infinity's NVMe tier): memory holds params and grads only; the "
                  "step pays reading and writing them (zerodp bench-io DIR measures the disk; "
                  "docs/offload.md). optimizer,params (stage 3): each rank's parameter shard "
                  "too, read from disk before each gather, so memory holds the gradients and "
                  "the gathered units. none, optimizer or optimizer,params")
      ->capture_default_str();
  par->add_option("--offload-dir", c.offload_dir,
                  "Directory for --offload's scratch files (unlinked at once: nothing is left "
                  "behind); use a disk, not tmpfs")
      ->capture_default_str();
  par->add_option("--offload-piece", f->offload_piece,
                  "Elements per staged piece of --offload (a multiple of 1024, of 2048 with "
                  "params; 0 = 1048576, 4 MiB per array): larger pieces, longer sequential I/O, "
                  "more staging memory")
      ->capture_default_str();
  par->add_option("--offload-overlap", c.offload_overlap,
                  "Stages 0 and 3 with --offload: run the update on its own thread while the "
                  "next step's forward starts on the units already updated (on/off; the same "
                  "bits either way; pays with a spare core per rank, docs/offload.md)")
      ->capture_default_str();
  par->add_option("--qgz", f->qgz,
                  "Reduce gradients as int8 or int4 blocks with an fp32 scale each (at stage 0 "
                  "the all-reduce's reduce-scatter half), "
                  "inside each node then across nodes (ZeRO++'s qgZ), summed in fp32 at the "
                  "owner; off, int8 or int4")
      ->capture_default_str();
  // Checked as text: the unsigned count would take -1 as 2^64 - 1.
  par->add_option("--qgz-block", c.launch.comm.qgz_block, "Elements per quantization scale (--qgz)")
      ->check(kBlockRange)
      ->capture_default_str();
  par->add_option("--collectives", f->collectives,
                  "flat: every rank exchanges with every rank; two-level (with --node-ranks): "
                  "inside each node, then across nodes with one rank per node and local "
                  "index, T times fewer bytes between nodes, in an order that depends on T "
                  "(so not --invariant on; docs/topology.md)")
      ->capture_default_str();
  auto* opt = app.add_option_group("Optimization");
  opt->add_option("--steps", c.steps, "Optimizer steps")->capture_default_str();
  opt->add_option("--seed", f->seed, "Seed for init and data order (0..2^64-1)")
      ->capture_default_str();
  opt->add_option("--lr", f->lr, "Peak learning rate")->capture_default_str();
  opt->add_option("--schedule", c.schedule, "constant or cosine (with linear warmup)")
      ->capture_default_str();
  opt->add_option("--warmup", f->warmup,
                  "Warmup steps, or auto: 5% of --steps with cosine, none with constant")
      ->capture_default_str();
  opt->add_option("--clip", f->clip, "Clip the global gradient norm to this (0 = off)")
      ->capture_default_str();
  opt->add_option("--weight-decay", f->weight_decay, "AdamW decoupled weight decay")
      ->capture_default_str();
  opt->add_flag("--decay-all", c.decay_all,
                "Decay norms and biases too (as the PyTorch peer does)");
  auto* ck = app.add_option_group("Checkpoints");
  ck->add_option("--checkpoint-dir", c.checkpoint_dir,
                 "Save sharded checkpoints here (DIR/step_NNNNNNNN/, DIR/latest); also at the "
                 "last step");
  // Ranges are checked with the others (validate()), in words: CLI11's NonNegativeNumber
  // printed the largest double in 300 digits.
  ck->add_option("--checkpoint-every", c.checkpoint_every, "Save every K steps (0 = last only)")
      ->capture_default_str();
  ck->add_option("--keep", c.keep, "Committed checkpoints to keep, newest first (0 = all)")
      ->capture_default_str();
  ck->add_option("--resume", c.resume,
                 "Continue from a checkpoint: a step directory, a checkpoint dir, or 'latest' "
                 "(the newest in --checkpoint-dir); --steps stays the total. Any --ranks and "
                 "--stage may load it");
  ck->add_option("--stop-after", c.stop_after,
                 "Stop after this step, the schedule still planned for --steps (a time slice; "
                 "continue with --resume)");
  auto* rel = app.add_option_group("Reliability");
  rel->add_option("--max-skips", c.max_skips,
                  "Stop after this many consecutive skipped (non-finite) steps, naming the unit "
                  "and rank (0 = never)")
      ->capture_default_str();
  rel->add_option("--inject", f->inject,
                  "Inject a fault, for tests and demos: KIND@STEP[:RANK], KIND one of throw, "
                  "hang, kill, nan, io, oom, term (a stop request, as SIGTERM on that rank alone) "
                  "(repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  rel->add_option("--max-restarts", c.max_restarts,
                  "Local backend: when a rank fails, reload the latest checkpoint and go on with "
                  "the ranks left (the largest count below that divides the step's "
                  "micro-batches, the batch kept), at most this many times (0 = a failure ends "
                  "the run). Needs --checkpoint-dir and --checkpoint-every; under MPI relaunch "
                  "with mpirun -np N' ... --resume latest")
      ->capture_default_str();
  auto* out = app.add_option_group("Output");
  out->add_option("--eval-every", c.eval_every,
                  "Validation loss every K steps (0 = at the end only)")
      ->capture_default_str();
  out->add_option("--eval-batches", c.eval_batches,
                  "Validation micro-batches in all, shared among the ranks")
      ->capture_default_str();
  out->add_option("--metrics", c.metrics_path, "Write one JSON line per step here");
  out->add_option("--report", c.report_path, "Write the run's report (docs/report.md) here");
  out->add_option("--trace", c.trace_path,
                  "Write a Chrome trace (chrome://tracing, Perfetto) of every rank's compute "
                  "and collectives here; under MPI one file per rank, FILE.rankR.json");
  out->add_flag("--no-progress", f->no_progress, "No progress output");
  return [f, ranks, &app](Launch args) {
    f->ranks_given = ranks->count() > 0;
    // What the user set, by the keys config_json and the idle-option rules use (a --config
    // file's keys arrive here as flags; a report's nulls never do).
    std::set<std::string> given;
    const auto collect = [&given](const CLI::App& from) {
      for (const CLI::Option* o : from.get_options()) {
        if (o->count() == 0) continue;
        for (std::string name : o->get_lnames()) {
          for (char& ch : name) ch = ch == '-' ? '_' : ch;
          given.insert(name);
        }
      }
    };
    collect(app);
    // Option groups are nameless subcommands holding their own options.
    for (const CLI::App* group :
         app.get_subcommands([](const CLI::App* a) { return a->get_name().empty(); })) {
      collect(*group);
    }
    f->cfg.given = std::move(given);
    return run_train(*f, args);
  };
}

}  // namespace zerodp::cli
