// The optimization, checkpoints, reliability and output of a run, a part of the option table
// (options.h).
#include <charconv>
#include <cmath>
#include <string>

#include <fmt/core.h>

#include "core/error.h"
#include "core/units.h"
#include "train/option_readers.h"
#include "train/options.h"

namespace zerodp {
namespace {

using nlohmann::json;
using Form = OptionSpec::Form;
using namespace option_readers;

constexpr std::string_view kOptimization = "Optimization", kCheckpoints = "Checkpoints",
                           kReliability = "Reliability", kOutput = "Output";

const OptionSpec kTrainingOptions[] = {
    // Optimization.
    {.key = "steps",
     .section = kOptimization,
     .help = "Optimizer steps (0: none; with --checkpoint-dir the starting weights are saved "
             "as step 0, e.g. those of --init-from)",
     .advice = "use 0 or more",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.steps = whole<int64_t>(t, o); },
     .check = [](const TrainConfig& c, const OptionSpec& o) { at_least<int64_t>(c.steps, 0, o); },
     .record = [](const TrainConfig& c) -> json { return c.steps; }},
    {.key = "seed",
     .section = kOptimization,
     .help = "Seed for init and data order (0..2^64-1)",
     .type = "INT",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.seed = parse_seed(t, o.flag()); },
     .record = [](const TrainConfig& c) -> json { return c.seed; }},
    {.key = "lr",
     .section = kOptimization,
     .help = "Peak learning rate",
     .advice = "use a positive number, e.g. 1e-3 or 3e-4",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.lr = static_cast<float>(finite(t, o, 0, true)); },
     .check =
         [](const TrainConfig& c, const OptionSpec& o) {
           if (!(c.lr > 0) || !std::isfinite(c.lr)) o.refuse(fmt::format("{}", c.lr));
         },
     .record = [](const TrainConfig& c) -> json { return c.lr; }},
    {.key = "schedule",
     .section = kOptimization,
     .help = "constant or cosine (with linear warmup)",
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.schedule = t; },
     .check =
         [](const TrainConfig& c, const OptionSpec&) {
           if (c.schedule != "constant" && c.schedule != "cosine") {
             throw InvalidArgument(
                 fmt::format("--schedule '{}' is unknown; use constant or cosine", c.schedule));
           }
         },
     .record = [](const TrainConfig& c) -> json { return c.schedule; }},
    {.key = "warmup",
     .section = kOptimization,
     .help = "Warmup steps, or auto: 5% of --steps with cosine, none with constant",
     .advice = "use auto or a whole number of steps, e.g. 100",
     .type = "INT|auto",
     .shown = "auto",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           c.warmup = t == "auto" ? -1 : whole<int64_t>(t, o);
           if (c.warmup < -1 || (c.warmup == -1 && t != "auto")) o.refuse(t);
         },
     .check = [](const TrainConfig& c, const OptionSpec& o) { at_least<int64_t>(c.warmup, -1, o); },
     .record = [](const TrainConfig& c) -> json { return c.warmup; }},
    {.key = "clip",
     .section = kOptimization,
     .help = "Clip the global gradient norm to this (0 = off)",
     .advice = "use 0 (off) or a positive norm, e.g. 1.0",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.clip = static_cast<float>(finite(t, o, 0, false)); },
     .check =
         [](const TrainConfig& c, const OptionSpec& o) {
           if (!(c.clip >= 0) || !std::isfinite(c.clip)) o.refuse(fmt::format("{}", c.clip));
         },
     .record = [](const TrainConfig& c) -> json { return c.clip; }},
    {.key = "optimizer_states",
     .section = kOptimization,
     .help = "Adam's moments: fp32, or int8 (blocks of 256 with an fp32 scale each, a "
             "dynamic-exponent code; tensors under 4096 elements stay fp32): about 2 bytes per "
             "parameter instead of 8, the same bits at every stage and rank count; the master "
             "weights stay fp32 (docs/optimizer_states.md)",
     .commands = kBoth,
     .advice = "use fp32 or int8",
     .type = "STATES",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           if (t != "fp32" && t != "int8") o.refuse(t);
           c.int8_moments = t == "int8";
         },
     .record = [](const TrainConfig& c) -> json { return c.int8_moments ? "int8" : "fp32"; }},
    {.key = "weight_decay",
     .section = kOptimization,
     .help = "AdamW decoupled weight decay",
     .advice = "use 0 (none) or a positive number, e.g. 0.1",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           c.weight_decay = static_cast<float>(finite(t, o, 0, false));
         },
     .check =
         [](const TrainConfig& c, const OptionSpec& o) {
           if (!(c.weight_decay >= 0) || !std::isfinite(c.weight_decay)) {
             o.refuse(fmt::format("{}", c.weight_decay));
           }
         },
     .record = [](const TrainConfig& c) -> json { return c.weight_decay; }},
    {.key = "decay_all",
     .section = kOptimization,
     .help = "Decay norms and biases too (as the PyTorch peer does)",
     .form = Form::kSwitch,
     .read = [](TrainConfig& c, const std::string&, const OptionSpec&) { c.decay_all = true; },
     .record = [](const TrainConfig& c) -> json { return c.decay_all; }},
    // Checkpoints.
    {.key = "checkpoint_dir",
     .section = kCheckpoints,
     .help = "Save sharded checkpoints here (DIR/step_NNNNNNNN/, DIR/latest); also at the last "
             "step",
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.checkpoint_dir = t; },
     .record = [](const TrainConfig& c) -> json { return c.checkpoint_dir; }},
    {.key = "checkpoint_every",
     .section = kCheckpoints,
     .help = "Save every K steps (0 = last only)",
     .advice = "use 0 or more steps",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.checkpoint_every = whole<int64_t>(t, o); },
     .check = [](const TrainConfig& c,
                 const OptionSpec& o) { at_least<int64_t>(c.checkpoint_every, 0, o); },
     .record = [](const TrainConfig& c) -> json { return c.checkpoint_every; }},
    {.key = "checkpoint_async",
     .section = kCheckpoints,
     .help = "Write checkpoints in the background: each rank copies its shard into staging "
             "memory (its size in the memory ledger) at the step, a thread writes it while "
             "training goes on, and a later step commits it once every rank's files are "
             "durable; the files are a synchronous save's (docs/checkpoint_format.md); "
             "estimate: add the staging to each row's need",
     .commands = kBoth,
     .form = Form::kSwitch,
     .read = [](TrainConfig& c, const std::string&,
                const OptionSpec&) { c.checkpoint_async = true; },
     .record = [](const TrainConfig& c) -> json { return c.checkpoint_async; },
     .idle =
         [](const TrainConfig& c) {
           return unless(!c.checkpoint_dir.empty(),
                         "it writes checkpoints in the background; add --checkpoint-dir DIR");
         },
     .idle_refused_in = kTrainCommand},
    {.key = "checkpoint_busy",
     .section = kCheckpoints,
     .help = "--checkpoint-async: a save due while the last is still being written waits for "
             "it (wait) or is skipped (skip; the report counts it)",
     .advice = "use wait or skip",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           if (t != "wait" && t != "skip") o.refuse(t);
           c.checkpoint_skip_busy = t == "skip";
         },
     .record = [](const TrainConfig& c) -> json {
       return c.checkpoint_skip_busy ? "skip" : "wait";
     },
     .idle =
         [](const TrainConfig& c) {
           return unless(c.checkpoint_async,
                         "it says what a save due during an asynchronous one does; add "
                         "--checkpoint-async");
         }},
    {.key = "checkpoint_signal_wait",
     .section = kCheckpoints,
     .help = "--checkpoint-async: on SIGINT/SIGTERM, how long the save in flight may still "
             "take; written in time it is committed and the interrupted step saved, else it is "
             "abandoned (latest stays at the last committed) and the run ends at once",
     .advice = "use a duration of 0 or more, below --collective-timeout, e.g. 30 or 2.5s",
     .type = "DURATION",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           c.checkpoint_signal_wait = parse_seconds(t, o.flag(), 0, kCollectiveTimeoutMax);
         },
     .record = [](const TrainConfig& c) -> json { return c.checkpoint_signal_wait; },
     .idle =
         [](const TrainConfig& c) {
           return unless(c.checkpoint_async,
                         "it bounds the wait for an asynchronous save on a signal; add "
                         "--checkpoint-async");
         }},
    {.key = "keep",
     .section = kCheckpoints,
     .help = "Committed checkpoints to keep, newest first (0 = all)",
     .advice = "use 0 (keep all) or more",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.keep = whole<int>(t, o); },
     .check = [](const TrainConfig& c, const OptionSpec& o) { at_least(c.keep, 0, o); },
     .record = [](const TrainConfig& c) -> json { return c.keep; }},
    {.key = "resume",
     .section = kCheckpoints,
     .help = "Continue from a checkpoint: a step directory, a checkpoint dir, or 'latest' (the "
             "newest in --checkpoint-dir); --steps stays the total. Any --ranks and --stage may "
             "load it",
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.resume = t; },
     .record = [](const TrainConfig& c) -> json { return c.resume; }},
    {.key = "init_from",
     .section = kCheckpoints,
     .help = "Start from these weights (fine-tuning): a safetensors file of the model's tensors "
             "by name, as zerodp export writes them or a PyTorch state dict saved under the "
             "same names; F32, BF16 or F16. Each rank reads only its own ranges; the report "
             "records the file's sha256. A resume takes the checkpoint's weights instead",
     .type = "FILE",
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.init_from = t; },
     .record = [](const TrainConfig& c) -> json { return c.init_from; }},
    {.key = "checkpoint_storage",
     .section = kCheckpoints,
     .help = "shared: --checkpoint-dir is one directory every host sees; node-local: each "
             "host's own disk (as DeepSpeed's node-local storage): a host's ranks write their "
             "shards there, every host commits the step, and --resume latest takes the newest "
             "step every host committed; it resumes on the same hosts",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           if (t != "shared" && t != "node-local") {
             throw InvalidArgument(fmt::format(
                 "{} '{}' is unknown; use shared (one directory every host sees) or node-local "
                 "(each host's own disk)",
                 o.flag(), t));
           }
           c.node_local_checkpoints = t == "node-local";
         },
     .record = [](const TrainConfig& c) -> json {
       return c.node_local_checkpoints ? "node-local" : "shared";
     },
     .idle =
         [](const TrainConfig& c) {
           return unless(!c.checkpoint_dir.empty(),
                         "it says where --checkpoint-dir lives, and there is none; add "
                         "--checkpoint-dir DIR");
         }},
    {.key = "stop_after",
     .section = kCheckpoints,
     .help = "Stop after this step, the schedule still planned for --steps (a time slice; "
             "continue with --resume)",
     .advice = "use 0 (run to --steps) or a step",
     .shown = "-",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.stop_after = whole<int64_t>(t, o); },
     .check = [](const TrainConfig& c,
                 const OptionSpec& o) { at_least<int64_t>(c.stop_after, 0, o); },
     .record = [](const TrainConfig& c) -> json { return c.stop_after; }},
    // Reliability.
    {.key = "max_skips",
     .section = kReliability,
     .help = "Stop after this many consecutive skipped (non-finite) steps, naming the unit and "
             "rank (0 = never)",
     .advice = "use 0 (never stop) or more",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.max_skips = whole<int>(t, o); },
     .check = [](const TrainConfig& c, const OptionSpec& o) { at_least(c.max_skips, 0, o); },
     .record = [](const TrainConfig& c) -> json { return c.max_skips; }},
    {.key = "inject",
     .section = kReliability,
     .help = "Inject a fault, for tests and demos: KIND@STEP[:RANK], KIND one of throw, hang, "
             "kill, nan, io, slowio (that step's shard write 2 s slower), commitio (that step's "
             "commit fails on the rank that commits: 0, or a host's first), slowcommit (that "
             "commit 2 s "
             "slower), oom, term (a stop request, "
             "as SIGTERM on that rank alone) "
             "(repeatable)",
     .form = Form::kRepeated,
     .type = "KIND@STEP[:RANK]",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec&) { c.inject.push_back(parse_injection(t)); }},
    {.key = "max_restarts",
     .section = kReliability,
     .help = "Local backend: when a rank fails, reload the latest checkpoint and go on with the "
             "ranks left (the largest count below that divides the step's micro-batches, the "
             "batch kept), at most this many times (0 = a failure ends the run). Needs "
             "--checkpoint-dir and --checkpoint-every; under MPI relaunch with mpirun -np N' "
             "... --resume latest",
     .advice = "use 0 (a failure ends the run) or more",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.max_restarts = whole<int>(t, o); },
     .check = [](const TrainConfig& c, const OptionSpec& o) { at_least(c.max_restarts, 0, o); },
     .record = [](const TrainConfig& c) -> json { return c.max_restarts; }},
    // Output.
    {.key = "eval_every",
     .section = kOutput,
     .help = "Validation loss every K steps (0 = at the end only)",
     .advice = "use 0 (at the end only) or a number of steps",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.eval_every = whole<int64_t>(t, o); },
     .check = [](const TrainConfig& c,
                 const OptionSpec& o) { at_least<int64_t>(c.eval_every, 0, o); },
     .record = [](const TrainConfig& c) -> json { return c.eval_every; }},
    {.key = "eval_batches",
     .section = kOutput,
     .help = "Validation micro-batches in all, shared among the ranks",
     .advice = "use 0 (none) or more",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.eval_batches = whole<int>(t, o); },
     .check = [](const TrainConfig& c, const OptionSpec& o) { at_least(c.eval_batches, 0, o); },
     .record = [](const TrainConfig& c) -> json { return c.eval_batches; }},
    {.key = "metrics",
     .section = kOutput,
     .help = "Write one JSON line per step here",
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.metrics_path = t; }},
    {.key = "report",
     .section = kOutput,
     .help = "Write the run's report (docs/report.md) here",
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.report_path = t; }},
    {.key = "trace",
     .section = kOutput,
     .help = "Write a Chrome trace (chrome://tracing, Perfetto) of every rank's compute and "
             "collectives here; under MPI one file per rank, FILE.rankR.json",
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.trace_path = t; },
     .record = [](const TrainConfig& c) -> json { return c.trace_path; }},
    {.key = "no_progress",
     .section = kOutput,
     .help = "No progress output",
     .form = Form::kSwitch,
     .read = [](TrainConfig& c, const std::string&, const OptionSpec&) { c.progress = false; }},
};

}  // namespace

std::span<const OptionSpec> training_option_table() { return kTrainingOptions; }

}  // namespace zerodp
