// engine.h is the contract. The run around the step loop: where it starts (fresh, or a
// checkpoint), the MFU terms, the per-rank trainers on the launched backend, when to
// evaluate, checkpoint and stop, and the result every rank's summary goes into.
#include "train/engine.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <optional>
#include <span>
#include <thread>
#include <type_traits>
#include <variant>
#include <vector>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "checkpoint/store.h"
#include "comm/communicator.h"
#include "comm/local.h"
#include "core/error.h"
#include "core/files.h"
#include "core/mutex.h"
#include "core/sha256.h"
#include "core/sysinfo.h"
#include "data/source.h"
#include "models/model.h"
#include "train/async_save.h"
#include "train/checkpoint_resume.h"
#include "train/checkpoint_save.h"
#include "train/checkpoint_shards.h"
#include "train/continuation.h"
#include "train/elastic.h"
#include "train/initial_weights.h"
#include "train/model_kind.h"
#include "train/outputs.h"
#include "train/plan.h"
#include "train/rank_summary.h"
#include "train/rank_trainer.h"
#include "train/report.h"
#include "train/run_check.h"
#include "train/setup.h"
#include "train/stop.h"
#include "train/trace.h"

namespace zerodp {
namespace {

DataSplits open_training_data(const TrainConfig& cfg) {
  DataOptions dopt;
  dopt.source = cfg.data;
  dopt.task = model_kind(cfg.model).task;
  dopt.seq_len = cfg.seq_len;
  dopt.seed = cfg.seed;
  dopt.tokenizer = cfg.tokenizer;
  if (cfg.vocab > 0) dopt.vocab = static_cast<uint64_t>(cfg.vocab);
  if (!cfg.cache_dir.empty()) dopt.cache_dir = cfg.cache_dir;
  DataSplits data = open_data(dopt);
  // A token past the vocabulary would index past the embedding: refused before any rank
  // holds a state, naming where it stands and the vocabulary that would hold it.
  if (cfg.vocab > 0) {
    for (const Dataset* d : {&data.train, &data.validation}) {
      const auto* tokens = std::get_if<TokenDataset>(d);
      if (tokens == nullptr) continue;
      const auto [token, at] = tokens->largest_token();
      if (token < cfg.vocab) continue;
      throw InvalidArgument(fmt::format(
          "--vocab {} does not hold the data's token {} (byte {} of {}); use --vocab {} or "
          "more, or leave it out for the byte vocabulary (256)",
          cfg.vocab, token, tokens->begin_byte() + at, tokens->name(), token + 1));
    }
  }
  return data;
}

// MFU's numerator per token, and the products the model's units declare for one of the
// run's micro-batches (empty for a caller's model that declares none).
struct ModelCost {
  double flops_per_token = 0;
  std::vector<GemmShape> products;
};

ModelCost model_cost(const TrainConfig& cfg, const DataSplits& data,
                     const ModelFactory& make_model) {
  const Model m = make_model ? make_model() : build_model(cfg);
  double phi = 0;
  for (const auto& u : m) phi += static_cast<double>(u->numel());
  // The micro-batch as the rank trainers shape it.
  const BatchShape shape{.B = cfg.micro_batch,
                         .T = is_language_model_data(data.train) ? cfg.seq_len : 1};
  return {.flops_per_token = model_kind(cfg.model).flops_per_token(cfg, phi),
          .products = model_products(m, shape)};
}

// The cores this run's GEMMs occupy: on each host, its ranks' threads, at most the host's
// cores (ranks past the cores share them and add nothing to the peak): the cores its
// affinity allows (a host pinned to a cpuset has those, not the machine's).
double cores_in_peak(const Communicator& comm, const LaunchOptions& launch) {
  const int cores = usable_cores();
  const int local_ranks = ranks_on_this_host(comm, launch);
  const double hosts = std::ceil(static_cast<double>(comm.size()) / local_ranks);
  return hosts *
         std::min(static_cast<double>(local_ranks) * gemm_threads(), static_cast<double>(cores));
}

// --max-skips: consecutive steps skipped for a non-finite gradient or loss end the run.
// Every rank takes the same verdicts, so every rank stops at the same step.
class SkipStreak {
 public:
  explicit SkipStreak(int64_t max_skips) : max_(max_skips) {}
  std::optional<EarlyStop> observe(const StepRecord& rec) {
    if (!rec.skipped) {
      streak_ = 0;
      return std::nullopt;
    }
    if (streak_++ == 0) start_ = rec;
    if (max_ <= 0 || streak_ < max_) return std::nullopt;
    return EarlyStop{
        .reason = EarlyStop::Reason::kMaxSkips,
        .after_step = rec.step,
        .message = fmt::format(
            "step {}: {} consecutive steps skipped for non-finite gradients or loss "
            "(--max-skips {}); the first, step {}, had one in unit {} on rank {}; lower "
            "--lr, check the data, or pass --max-skips 0 to never stop",
            rec.step, streak_, max_, start_.step,
            start_.bad_unit.empty() ? "(the loss)" : start_.bad_unit, start_.bad_rank)};
  }

 private:
  int64_t max_;
  int64_t streak_ = 0;
  StepRecord start_;
};

// What every rank's run needs, decided before any rank starts.
struct RunPlan {
  const TrainConfig& cfg;
  const DataSplits& data;
  const ModelFactory& make_model;
  std::filesystem::path resume_from;
  double flops_per_token = 0;
  double gemm_flops_per_core = 0;
  std::optional<double> model_shapes_flops_per_core;  // nullopt: the model declares no products
  std::span<const Restart> restarts;                  // before this launch
  const InitDigest* init = nullptr;                   // of cfg.init_from, on a fresh start from it
  // Local ranks: one slot per rank, each written by its own thread only.
  std::vector<RankFailure>* failures = nullptr;
};

// A rank's run after its steps, before the summary exchange.
struct RankRun {
  std::vector<StepRecord> steps;
  std::vector<checkpoint::StepHistory> carried;  // rank 0: the checkpoint's, then this run's
  size_t earlier = 0;                            // how many of `carried` came with the checkpoint
  int64_t first = 1;
  // The checkpoint it continued from: the plan's, or on node-local storage the newest step
  // every host held (open_resume_point).
  std::filesystem::path resumed_from;
  std::optional<EarlyStop> stopped;
  SaveStats saves;  // this rank's
  double peak = 0;
  double peak_cores = 0;
  std::optional<double> peak_model_shapes;
};

// A continuation's states and counters into the trainer. The counters go through the
// trainer's optimizer because its scaler settings decide whether a saved loss scaler's state
// is one this run can go on with.
void resume_trainer(RankTrainer& trainer, const checkpoint::Checkpoint& ckpt) {
  const RunCounters c = load_checkpoint(trainer.config(), rank_shards(trainer, false),
                                        run_data(trainer), trainer.comm(), ckpt);
  try {
    trainer.optimizer().restore(c.optimizer);
  } catch (const InvalidArgument& e) {
    throw CorruptData(
        fmt::format("{}: loss_scaler: {}", (ckpt.dir() / "meta.json").string(), e.what()));
  }
  trainer.sampler().set_position(c.data);
  trainer.set_samples_chain(c.samples_chain, c.samples_chain_from);
}

// Where the run starts: a continuation takes the checkpoint's states, counters and history
// (`from`, verified, released once read), a fresh start from --init-from its weights.
void start_from(const RunPlan& plan, RankTrainer& trainer,
                std::optional<checkpoint::Checkpoint>& from, RankRun& run) {
  const TrainConfig& cfg = plan.cfg;
  if (from) {
    check_same_model(trainer.config(), states_meta(trainer.state(), trainer.group().size()).units,
                     *from);
    const int64_t saved = static_cast<int64_t>(from->meta().step);
    if (saved > cfg.steps) {
      throw InvalidArgument(fmt::format(
          "--resume {}: the checkpoint is at step {}, past --steps {}; --steps is the total "
          "count, so use --steps {} or more",
          plan.resume_from.string(), saved, cfg.steps, saved));
    }
    // A time slice that ends before the checkpoint would train nothing and re-save it.
    if (cfg.stop_after > 0 && cfg.stop_after < saved) {
      throw InvalidArgument(fmt::format(
          "--stop-after {}: the checkpoint {} is already at step {}; --stop-after is a step "
          "number, so use one past it, e.g. --stop-after {}",
          cfg.stop_after, plan.resume_from.string(), saved, saved + 1));
    }
    resume_trainer(trainer, *from);
    // The steps every checkpoint of this run carries: the loaded checkpoint's, then this
    // run's, so a report after any number of resumes has them all.
    if (trainer.comm().rank() == 0) run.carried = from->history();
    run.first = saved + 1;
    run.resumed_from = from->dir();
    from.reset();
  } else if (!cfg.init_from.empty()) {
    load_initial_weights(trainer.islands(), *plan.init);  // every island starts from them
  }
  // A fresh start's global weights are the ones every island starts from.
  if (OuterStep* outer = trainer.outer(); outer != nullptr && run.resumed_from.empty()) {
    outer->begin();
  }
}

// Step s run, evaluated when due and saved through `saver` (null without --checkpoint-dir),
// its record added to the run; a stop it decides is run.stopped.
void run_one_step(const RunPlan& plan, RankTrainer& trainer, Saver* saver, SkipStreak& skips,
                  int64_t s, int64_t last, RankRun& run) {
  const TrainConfig& cfg = plan.cfg;
  Communicator& comm = trainer.comm();
  StepRecord rec;
  try {
    {
      const Tracer::Span span(trainer.tracer(), fmt::format("step {}", s), "step");
      rec = trainer.step(s);
    }
    run.stopped = skips.observe(rec);
    if (rec.stop_signal != 0 && !run.stopped && s < last) {
      run.stopped = EarlyStop{
          .reason = EarlyStop::Reason::kSignal,
          .signal = rec.stop_signal,
          .after_step = s,
          .message = fmt::format("step {}: interrupted by {}", s, signal_name(rec.stop_signal))};
    }
    const bool interrupted = run.stopped && run.stopped->reason == EarlyStop::Reason::kSignal;
    if (cfg.eval_every > 0 && s % cfg.eval_every == 0 && s != cfg.steps && !interrupted) {
      CommPhaseScope other(comm.ledger(), CommPhase::kOther);
      rec.val_loss = trainer.evaluate();
    }
    if (comm.rank() == 0) run.carried.push_back(history_of(rec));
    try {
      const SaveBoundary b{.step = s,
                           .due = cfg.checkpoint_every > 0 && s % cfg.checkpoint_every == 0,
                           .last = s == last,
                           .interrupted = interrupted,
                           .stopping = run.stopped.has_value(),
                           .history = &run.carried};
      if (const std::optional<int64_t> committed = saver ? saver->at_boundary(b) : std::nullopt) {
        rec.checkpoint =
            checkpoint::step_dir(cfg.checkpoint_dir, static_cast<uint64_t>(*committed)).string();
      }
    } catch (const CheckpointNotCommitted& e) {
      // Every rank caught the same verdict here: they stop together, and the report says
      // what was trained and why the run ended.
      run.stopped = EarlyStop{.reason = EarlyStop::Reason::kCheckpointFailed,
                              .after_step = s,
                              .message = fmt::format("step {}: {}", s, e.what())};
    }
  } catch (...) {
    if (plan.failures != nullptr) {
      (*plan.failures)[static_cast<size_t>(comm.rank())] = failure_of(std::current_exception(), s);
    }
    // Under MPI the launcher names the rank.
    rethrow_with_context(cfg.launch.backend == Backend::kLocal
                             ? fmt::format("rank {} of {}, step {}", comm.rank(), comm.size(), s)
                             : fmt::format("step {}", s));
  }
  if (run.peak > 0 && rec.seconds > 0) {
    rec.mfu = plan.flops_per_token * static_cast<double>(rec.tokens) / rec.seconds / run.peak;
  }
  run.steps.push_back(rec);
}

// Rank `comm.rank()`'s steps: from a fresh start or the checkpoint, evaluating,
// checkpointing and stopping as the configuration says.
// `from`: the verified checkpoint to continue from, released once read.
RankRun run_steps(const RunPlan& plan, RankTrainer& trainer,
                  std::optional<checkpoint::Checkpoint>& from, const StepCallback& on_step) {
  const TrainConfig& cfg = plan.cfg;
  Communicator& comm = trainer.comm();
  const bool reporter = comm.rank() == 0;
  RankRun run;
  start_from(plan, trainer, from, run);
  if (reporter && !cfg.checkpoint_dir.empty()) {
    std::filesystem::create_directories(cfg.checkpoint_dir);
    checkpoint::clean_leftovers(cfg.checkpoint_dir);
  }
  run.earlier = run.carried.size();
  run.peak_cores = cores_in_peak(comm, cfg.launch);
  run.peak = plan.gemm_flops_per_core * run.peak_cores;
  if (plan.model_shapes_flops_per_core) {
    run.peak_model_shapes = *plan.model_shapes_flops_per_core * run.peak_cores;
  }
  const int64_t last = cfg.stop_after > 0 ? std::min(cfg.steps, cfg.stop_after) : cfg.steps;
  SkipStreak skips(cfg.max_skips);
  const std::unique_ptr<Saver> saver = make_saver(trainer, run.saves);
  // From here a signal is a stop request that saves what the steps did (train/stop.h).
  set_nothing_to_save(false);
  for (int64_t s = run.first; s <= last && !run.stopped; ++s) {
    run_one_step(plan, trainer, saver.get(), skips, s, last, run);
    if (reporter && on_step) on_step(run.steps.back(), cfg.steps);
  }
  // A continuation with nothing left to train re-saves where it stands: how a checkpoint
  // is resharded to another rank count or stage.
  if (run.first > last && saver) saver->save_now(run.first - 1, run.carried);
  return run;
}

// Rank 0's result from its run and every rank's summary.
void fill_result(TrainResult& result, const RunPlan& plan, RankTrainer& trainer, RankRun& run,
                 std::span<const double> summaries, size_t per_rank) {
  const TrainConfig& cfg = plan.cfg;
  Communicator& comm = trainer.comm();
  result.is_reporter = true;
  result.config = cfg;
  result.params = trainer.params();
  result.world_size = comm.size();
  result.backend = std::string(comm.backend_name());
  result.data_description = plan.data.description;
  result.data_tokenizer_sha256 = plan.data.tokenizer_sha256;
  result.steps = run.steps;
  result.saves = run.saves;
  for (size_t i = 0; i < run.earlier; ++i) result.history.push_back(record_of(run.carried[i]));
  result.final_loss = run.steps.empty() ? std::nan("") : run.steps.back().loss;
  result.resumed_from = run.resumed_from.string();
  if (run.resumed_from.empty() && plan.init != nullptr) result.init_sha256 = plan.init->sha256;
  result.first_step = run.first;
  result.restarts.assign(plan.restarts.begin(), plan.restarts.end());
  for (int r = 0; r < comm.size(); ++r) {
    result.ranks.push_back(
        unpack_summary(summaries.subspan(static_cast<size_t>(r) * per_rank, per_rank), r));
  }
  for (const auto& u : trainer.model()) {
    result.unit_names.push_back(u->name());
    result.unit_numel.push_back(u->numel());
  }
  result.unit_tensors = unit_tensors(trainer.model());
  std::vector<double> secs;
  uint64_t tokens = 0;
  double total = 0;
  for (const auto& st : run.steps) {
    secs.push_back(st.seconds);
    tokens += st.tokens;
    total += st.seconds;
  }
  std::sort(secs.begin(), secs.end());
  result.step_seconds_median = secs.empty() ? 0 : secs[secs.size() / 2];
  result.tokens_per_second = total > 0 ? static_cast<double>(tokens) / total : 0;
  result.flops_per_token = plan.flops_per_token;
  result.peak_flops = run.peak;
  result.peak_cores = run.peak_cores;
  result.mfu = run.peak > 0 ? plan.flops_per_token * result.tokens_per_second / run.peak : 0;
  result.peak_flops_model_shapes = run.peak_model_shapes;
  if (run.peak_model_shapes && *run.peak_model_shapes > 0) {
    result.mfu_model_shapes =
        plan.flops_per_token * result.tokens_per_second / *run.peak_model_shapes;
  }
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) == 0) {
    result.process_peak_rss_bytes = static_cast<uint64_t>(usage.ru_maxrss) * 1024;  // KiB
  }
}

// The vocabulary the data brings (token shards' manifest, --tokenizer), unless --vocab says.
void adopt_data_vocab(TrainConfig& cfg) {
  if (cfg.vocab == 0) cfg.vocab = static_cast<int>(data_vocabulary(cfg.data, cfg.tokenizer));
}

// The model a run continues (a checkpoint) or starts from (a Hugging Face directory). A
// resume without model flags builds the checkpoint's model (train/checkpoint_resume.h). A
// checkpoint that is not there yet is named once the directory's lock is held (another run
// may be writing it), by the same resume_point.
void adopt_given_model(TrainConfig& cfg) {
  std::filesystem::path from;
  if (!cfg.resume.empty()) {
    try {
      from = resume_point(cfg);
    } catch (const InvalidArgument&) {
    }
  }
  if (!from.empty()) {
    adopt_checkpoint_model(cfg, from);
  } else {
    adopt_init_model(cfg);
  }
}

// A stop requested before the first launch's first step ends the run with nothing trained.
void throw_if_stopped_before_training() {
  if (const int signal = stop_requested()) {
    throw Interrupted(fmt::format("interrupted by {} before the first step; nothing was trained",
                                  signal_name(signal)),
                      signal);
  }
}

// --trace: a rank's tracer, in its slot, hooked to its communicator.
Tracer* attach_tracer(std::unique_ptr<Tracer>& slot, Communicator& comm) {
  slot = std::make_unique<Tracer>(comm.rank());
  slot->attach(comm);
  return slot.get();
}

// Local ranks share one trace file, written after they finish.
void write_local_trace(const std::string& path, const std::vector<std::unique_ptr<Tracer>>& t) {
  std::vector<const Tracer*> all;
  for (const auto& one : t) all.push_back(one.get());
  write_trace(path, all);
}

// A rank's end of the run, after its steps: what it reports and the summaries rank 0 gathers.
struct RankEnd {
  double val = 0;
  std::vector<float> kept;
  std::string weights;
  std::string samples_chain;
  uint64_t samples_chain_from = 0;
  std::vector<double> mine, all;
};

// Memory as training left it (the evaluation and hash are not training), the validation
// loss, the weights hash, every rank's summary gathered, and (MPI) this rank's trace file.
RankEnd finish_rank(RankTrainer& trainer, const RankRun& run, Tracer* tracer, bool local) {
  Communicator& comm = trainer.comm();
  const TrainConfig& cfg = trainer.config();
  trainer.settle();  // the last step's update may still be streaming
  const RankSummary mem = memory_summary(trainer);
  CommPhaseScope other(comm.ledger(), CommPhase::kOther);
  RankEnd end;
  // An interrupted run ends as soon as it can: mpirun, for one, kills its processes shortly
  // after forwarding the signal.
  const bool interrupted = run.stopped && run.stopped->reason == EarlyStop::Reason::kSignal;
  end.val = interrupted ? std::nan("") : trainer.evaluate();
  const bool keep = cfg.keep_final_weights && comm.rank() == 0;
  end.weights = trainer.weights_sha256(keep ? &end.kept : nullptr);
  end.samples_chain = trainer.samples_chain();
  end.samples_chain_from = trainer.samples_chain_from();
  end.mine = pack_summary(mem, comm, trainer.samples_sha256());
  // Snapshot taken: the gather below is the last collective and is not in the summary.
  end.all = comm.gather_control(end.mine);
  if (tracer != nullptr) {
    comm.set_trace_hook(nullptr);
    if (!local) {
      std::filesystem::path p(cfg.trace_path);
      p.replace_filename(
          fmt::format("{}.rank{}{}", p.stem().string(), comm.rank(), p.extension().string()));
      const Tracer* one[] = {tracer};
      write_trace(p, one);
    }
  }
  return end;
}

// --islands: this rank's island (its N / I consecutive ranks) and column (the ranks of its
// index in every island, in island order), both counting in the world's ledger and traced
// with it. Islands are nodes unless --node-ranks says otherwise: then an island is whole
// nodes, or a part of one.
struct IslandComms {
  std::unique_ptr<Communicator> island, column;
};

IslandComms split_islands(Communicator& world, const TrainConfig& cfg, Tracer* tracer) {
  if (cfg.islands == 1) return {};
  const IslandLayout l = island_layout(cfg, world.size());
  CommOptions inside = cfg.launch.comm;
  inside.node_ranks = l.inside_node_ranks;
  // The outer all-reduce folds the islands' pseudo-gradients flat, in island order, in fp32.
  CommOptions across = cfg.launch.comm;
  across.node_ranks = l.across_node_ranks;
  across.two_level = false;
  across.qgz_bits = 0;
  IslandComms c;
  c.island = world.split(world.rank() / l.ranks, world.rank(), inside);
  c.column = world.split(world.rank() % l.ranks, world.rank(), across);
  c.island->count_in(world.ledger());
  c.column->count_in(world.ledger());
  if (tracer != nullptr) {
    tracer->attach(*c.island);
    tracer->attach(*c.column);
  }
  return c;
}

// Rank 0's result from its run and its end, and the report written: here, before MPI is
// finalized, since under mpirun a job being stopped may not get past the finalize before the
// launcher's SIGKILL, and the report must not be lost.
void report_run(TrainResult& result, const RunPlan& plan, RankTrainer& trainer, RankRun& run,
                RankEnd& end) {
  fill_result(result, plan, trainer, run, end.all, end.mine.size());
  if (std::isfinite(end.val)) {
    result.val_loss = end.val;
    if (const double bpt = plan.data.validation_bytes_per_token; bpt > 0) {
      result.val_bits_per_byte = end.val / std::log(2.0) / bpt;
    }
  }
  result.weights_sha256 = end.weights;
  result.samples_chain = end.samples_chain;
  result.samples_chain_from = end.samples_chain_from;
  result.final_weights = std::move(end.kept);
  if (!plan.cfg.report_path.empty()) {
    files::write_output("--report", plan.cfg.report_path, report_json(result).dump(2) + "\n");
  }
}

// A fresh start from --init-from: the file checked against the model once, before any rank
// holds a state, and hashed for the report in the same pass. nullopt when the run does not
// start from it.
std::optional<InitDigest> check_init_from(const TrainConfig& cfg, const ModelFactory& make_model,
                                          const std::filesystem::path& resume_from) {
  if (cfg.init_from.empty() || !resume_from.empty()) return std::nullopt;
  return check_initial_weights(make_model ? make_model() : build_model(cfg),
                               model_label(cfg.model, cfg.size), cfg.model, cfg.init_from);
}

// MFU's terms: the model's FLOPs per token and the GEMM peaks it is measured against.
struct Calibration {
  ModelCost cost;
  double gemm_peak = 0;
  std::optional<double> model_shapes_peak;
};

Calibration calibrate(const TrainConfig& cfg, const DataSplits& data,
                      const ModelFactory& make_model) {
  ModelCost cost = model_cost(cfg, data, make_model);
  const GemmCompute compute = compute_for(cfg.precision);
  const double peak = gemm_flops_per_core(compute);
  const std::optional<double> shapes = gemm_flops_per_core(compute, cost.products);
  return {.cost = std::move(cost), .gemm_peak = peak, .model_shapes_peak = shapes};
}

// Every rank runs the same options; under MPI each process also checked and hashed
// --init-from itself, so they must have read one file.
void check_same_run(const RunPlan& plan, Communicator& comm) {
  nlohmann::json options = config_json(plan.cfg);
  if (plan.init != nullptr) options["init_from (sha256)"] = plan.init->sha256;
  check_same_options(options, comm);
}

// One rank's run on its thread: its trainer, steps and end; rank 0 reports into `result`
// (under `mu`, which every rank thread of this process takes). `tracer_slot`: its --trace
// slot.
void run_rank(const RunPlan& plan, Communicator& comm, std::unique_ptr<Tracer>& tracer_slot,
              const StepCallback& on_step, Mutex& mu, TrainResult& result) {
  const TrainConfig& cfg = plan.cfg;
  const bool local = cfg.launch.backend == Backend::kLocal;
  std::optional<CheckpointDirLock> rank0_lock;
  if (!local && comm.rank() == 0) rank0_lock.emplace(cfg.checkpoint_dir);
  Tracer* tracer = cfg.trace_path.empty() ? nullptr : attach_tracer(tracer_slot, comm);
  check_same_run(plan, comm);
  // Every rank verifies the whole checkpoint before any state exists, so a corrupt one fails
  // every rank the same way.
  std::optional<checkpoint::Checkpoint> from = open_resume_point(comm, cfg, plan.resume_from);
  IslandComms islands = split_islands(comm, cfg, tracer);
  RankTrainer trainer(cfg, comm, plan.data, plan.make_model, islands.island.get(),
                      islands.column.get());
  trainer.set_tracer(tracer);
  RankRun run = run_steps(plan, trainer, from, on_step);
  RankEnd end = finish_rank(trainer, run, tracer, local);
  MutexLock lock(mu);
  result.stopped = run.stopped;  // every rank's is the same, and every process needs it
  if (comm.rank() != 0) return;
  report_run(result, plan, trainer, run, end);
}

}  // namespace

TrainResult train(const TrainConfig& config, int& argc, char**& argv, const StepCallback& on_step,
                  const ModelFactory& make_model, const RestartCallback& on_restart) {
  TrainConfig cfg = config;
  set_nothing_to_save(true);
  const bool default_policy = cfg.accumulate_default;
  bool derive_batch = cfg.grad_accum == 0;
  if (!make_model) adopt_given_model(cfg);
  adopt_data_vocab(cfg);
  resolve_config(cfg);
  check_launch_environment(cfg.launch);
  check_outputs(cfg);
  const bool local = cfg.launch.backend == Backend::kLocal;
  // Under MPI the rank-0 process takes it, below, once it knows it is rank 0. Held across
  // restarts: no other run may commit into the directory between two launches.
  std::optional<CheckpointDirLock> dir_lock;
  if (local) dir_lock.emplace(cfg.checkpoint_dir);
  const DataSplits data = open_training_data(cfg);
  // MFU's terms, calibrated before the first launch's ranks start, kept for any restart's.
  std::optional<Calibration> mfu;
  std::vector<Restart> restarts;

  // One launch of every rank, from a fresh start or a checkpoint, to the end of the run;
  // a rank's failure is rethrown, `failures` (local) saying which rank and step.
  const auto launch_once = [&](std::vector<RankFailure>* failures) {
    const std::filesystem::path resume_from = resume_point(cfg);
    std::optional<checkpoint::Meta> saved;
    if (derive_batch && !resume_from.empty()) saved = checkpoint::read_meta(resume_from);
    // Under MPI the world is known once launched; each process holds its own cfg.
    std::string order_note;
    if (saved && local) {
      order_note = keep_global_batch(cfg, resume_from, *saved,
                                     cfg.launch.ranks * hosted_islands(cfg), default_policy);
    }
    // Local ranks are threads of this process: every one of them is checked here, once,
    // before any thread starts (MPI processes each check themselves below), and before the
    // calibration times products of the micro-batch's shapes.
    if (local) {
      check_startable_threads(cfg.launch.ranks);
      preflight(cfg, data, make_model, cfg.launch.ranks, 0);
    }
    if (!mfu) mfu = calibrate(cfg, data, make_model);
    throw_if_stopped_before_training();
    const std::optional<InitDigest> init = check_init_from(cfg, make_model, resume_from);

    TrainResult result;
    Mutex mu;  // guards result: every rank thread of this process writes into it
    // Rank threads in this process: every rank (local), or --ranks-per-process (mpi).
    const int here = local ? cfg.launch.ranks : cfg.launch.ranks_per_process;
    // --trace: one tracer per rank. Local ranks share one file, written after they finish;
    // MPI ranks each write their own (the path with ".rankR" before the extension).
    std::vector<std::unique_ptr<Tracer>> tracers(static_cast<size_t>(here));
    launch(cfg.launch, argc, argv, [&](Communicator& comm) {
      // Under MPI the world is known only now, and a process's rank threads may each adjust
      // the batch to it: each takes its own copy of the configuration.
      std::optional<TrainConfig> own;
      if (!local) {
        own.emplace(cfg);
        resolve_world(*own, comm.size(), WorldNamed::kLaunched);
        if (saved) {
          const std::string note = keep_global_batch(
              *own, resume_from, *saved, comm.size() * hosted_islands(cfg), default_policy);
          if (comm.rank() == 0) order_note = note;
        }
        // The process's first rank checks the memory of all of them.
        if (comm.rank() % here == 0)
          preflight(*own, data, make_model, comm.size(), comm.rank(), here);
      }
      const TrainConfig& rank_cfg = own ? *own : cfg;
      const RunPlan rank_plan{.cfg = rank_cfg,
                              .data = data,
                              .make_model = make_model,
                              .resume_from = resume_from,
                              .flops_per_token = mfu->cost.flops_per_token,
                              .gemm_flops_per_core = mfu->gemm_peak,
                              .model_shapes_flops_per_core = mfu->model_shapes_peak,
                              .restarts = restarts,
                              .init = init ? &*init : nullptr,
                              .failures = failures};
      run_rank(rank_plan, comm, tracers[static_cast<size_t>(comm.rank() % here)], on_step, mu,
               result);
    });
    if (!cfg.trace_path.empty() && local) write_local_trace(cfg.trace_path, tracers);
    result.order_note = order_note;
    return result;
  };

  for (;;) {
    std::vector<RankFailure> failures(local ? static_cast<size_t>(cfg.launch.ranks) : 0);
    try {
      return launch_once(local ? &failures : nullptr);
    } catch (...) {
      if (!local || cfg.max_restarts == 0) throw;
      restarts.push_back(
          plan_restart(cfg, std::current_exception(), failures, restarts, default_policy));
    }
    derive_batch = false;  // plan_restart kept the batch
    if (on_restart) on_restart(restarts.back());
  }
}

}  // namespace zerodp
