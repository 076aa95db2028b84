// What a run produces, apart from its files: one record per step, how it ended, each
// rank's memory and communication summary, and the result train() returns. The report
// (train/report.h) reads these without knowing the engine that filled them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/ledger.h"
#include "memory/ledger.h"
#include "train/config.h"

namespace zerodp {

struct StepRecord {
  int64_t step = 0;  // 1-based
  double loss = 0;   // mean over ranks and micro-batches of the micro-batch mean loss
  double lr = 0;
  double grad_norm = 0;          // global norm of the averaged gradient, before clipping
  double grad_norm_clipped = 0;  // after clipping
  std::optional<double> loss_scale;
  bool skipped = false;
  uint64_t tokens = 0;  // processed by all ranks and micro-batches
  double seconds = 0;   // wall time
  // Of that, the time rank 0 spent reading its samples (token shards come from disk): what
  // a step waits for data.
  double data_seconds = 0;
  std::optional<double> val_loss;  // when evaluated after this step
  std::string checkpoint;          // the checkpoint committed after this step, if any
  std::optional<double> mfu;       // model FLOPs / (seconds x the calibrated GEMM peak)
  // When skipped for a non-finite value: the first rank (in rank order) whose owned
  // gradient held one, and the first such unit of that rank.
  int bad_rank = -1;
  std::string bad_unit;
  // A stop requested on any rank before this step's control exchange (train/stop.h): the
  // lowest signal number among the ranks' requests, 0 when none. Every rank sees the same.
  int stop_signal = 0;
  // --islands: the step ended with DiLoCo's outer step (train/outer_step.h).
  bool outer = false;
};

// Why a run ended before its last step, with everything it had done saved and reported.
struct EarlyStop {
  // kCheckpointFailed: a save every rank agreed was not committed (a full disk, a file size
  // limit): the run stops there rather than train on without the saves it was asked for,
  // and still reports what it trained.
  enum class Reason { kSignal, kMaxSkips, kCheckpointFailed };
  Reason reason = Reason::kSignal;
  int signal = 0;          // kSignal: SIGINT or SIGTERM
  int64_t after_step = 0;  // the last step taken
  std::string message;     // one line for the user, led by the step
};

// A rank's failure the run got past (--max-restarts, train/engine.h): it reloaded the
// latest checkpoint and went on with fewer ranks, the samples per step kept.
struct Restart {
  int64_t failed_step = 0;  // the step in progress when the rank failed
  int failed_rank = -1;     // -1 when unknown
  std::string cause;        // the failure's message
  int ranks_before = 0;
  int ranks_after = 0;
  int grad_accum_before = 0;
  int grad_accum_after = 0;
  int64_t resumed_step = 0;  // the checkpoint's step: steps after it were taken again
  std::string checkpoint;    // the checkpoint directory it reloaded
  // Why the survivors' bits may differ from the run that never failed; empty when they cannot.
  std::string order_note;
};

struct RankSummary {
  int rank = 0;
  MemoryLedger::Table model_state{};  // current bytes at the end (steady state)
  MemoryLedger::Table peak{};
  uint64_t peak_total = 0;
  // Outside the ledger: the rank thread's kept bf16 operand copies (tensor/gemm.h), 0 in fp32.
  uint64_t gemm_bf16_copy_bytes = 0;
  // --offload optimizer: the offload file's bytes (the ledger's disk bytes), and what the
  // tier moved over the run (initialization, steps, checkpoints) and how long the rank
  // waited for it.
  uint64_t nvme_bytes = 0;
  uint64_t offload_bytes_read = 0;
  uint64_t offload_bytes_written = 0;
  double offload_wait_seconds = 0;
  // The updates' share: bytes read + written and their wall time (the tier's disk rate).
  uint64_t offload_update_bytes = 0;
  double offload_update_seconds = 0;
  bool offload_direct = false;  // the file took O_DIRECT (not on tmpfs, for one)
  CommLedger::Table comm_train{};
  CommLedger::Table comm_other{};
  std::string samples_sha256;
};

// What a run's checkpoint saves did (rank 0's): asked for by the schedule, skipped
// (--checkpoint-async with --checkpoint-busy skip: the last still in flight), committed; the
// training thread's time in each save (its stall: the whole save when synchronous) and, for
// asynchronous saves, the writer thread's time.
struct SaveStats {
  int64_t requested = 0;
  int64_t skipped = 0;
  int64_t committed = 0;
  // The save in flight when a signal came and not written within --checkpoint-signal-wait.
  std::optional<int64_t> abandoned;
  std::vector<double> stall_seconds;
  std::vector<double> write_seconds;
  // The writer thread's CPU time in each (the rest of write_seconds it waited on the disk, or
  // for a core: on a machine whose cores all run ranks, this is what the saves take from the
  // steps).
  std::vector<double> write_cpu_seconds;
};

struct TrainResult {
  bool is_reporter = false;  // false on MPI ranks other than 0: the rest is unset there
  TrainConfig config;
  uint64_t params = 0;
  int world_size = 0;
  std::string backend;
  std::string data_description;
  std::string data_tokenizer_sha256;  // DataSplits::tokenizer_sha256
  std::vector<StepRecord> steps;      // the steps this run took: first_step..config.steps
  // On a continuation, the steps before first_step as the checkpoint's history carried them:
  // the fields the training determines only (seconds 0, no mfu, no checkpoint). Empty for a
  // fresh run, and for a checkpoint of an earlier version, which has no history.
  std::vector<StepRecord> history;
  int64_t first_step = 1;
  std::string resumed_from;  // the checkpoint directory continued from, or empty
  // On a continuation that derived --grad-accum: why its bits may differ from the run that
  // never stopped (keep_global_batch); empty when they cannot.
  std::string order_note;
  std::string init_sha256;  // of config.init_from when this run started from it, else empty
  double final_loss = 0;
  std::optional<double> val_loss;
  // val_loss in bits per byte of the validation text (val_loss / ln 2 / bytes per token):
  // what compares a byte-level and a tokenized run; nullopt when the data does not say its
  // bytes per token.
  std::optional<double> val_bits_per_byte;
  std::string weights_sha256;
  // Every step's global sample indices, chained (RankTrainer::samples_chain): the same for
  // any N, stage or resume that read the same samples in the same order. From the step the
  // chain started after (0 unless resumed from a checkpoint written before it was kept).
  std::string samples_chain;
  uint64_t samples_chain_from = 0;
  std::vector<RankSummary> ranks;
  double tokens_per_second = 0;
  // MFU: model FLOPs per token (6 per parameter plus attention's 12 x layers x T x C for the
  // gpt) x tokens/s / the peak: a single-threaded GEMM in the run's compute (bf16 for
  // --precision bf16, else fp32) timed at start-up, x the cores the ranks' GEMM threads occupy.
  double flops_per_token = 0;
  double peak_flops = 0;
  double peak_cores = 0;  // the cores in the peak: per host, its ranks' GEMM threads, capped
  double mfu = 0;
  // The second MFU: the same numerator over a peak of the model's own products, one core's
  // best single-threaded rate over the distinct GEMM shapes its forward and backward call
  // for the run's micro-batch, in the run's compute (train/setup.h), x peak_cores. nullopt
  // for a caller's model, whose units declare no products (Unit::products).
  std::optional<double> peak_flops_model_shapes;
  std::optional<double> mfu_model_shapes;
  double step_seconds_median = 0;
  // getrusage's peak resident set of this process at the end of the run: every rank thread
  // on the local backend, this rank alone under MPI (on rank 0, the reporter's own).
  uint64_t process_peak_rss_bytes = 0;
  std::vector<std::string> unit_names;
  std::vector<uint64_t> unit_numel;
  // Each unit's tensors' sizes: with --optimizer-states int8 what the planner lays blocks on.
  std::vector<std::vector<uint64_t>> unit_tensors;
  std::vector<float> final_weights;  // with config.keep_final_weights: canonical order
  // Set when the run stopped early: a signal (train/stop.h) or --max-skips. The steps,
  // checkpoint (a signal, with --checkpoint-dir) and summary are those of the steps taken.
  std::optional<EarlyStop> stopped;
  // The restarts before the launch that finished, in order; everything above (config,
  // world_size, steps, ranks, throughput) is that last launch's, and `history` carries the
  // steps before it from the checkpoint it reloaded.
  std::vector<Restart> restarts;
  SaveStats saves;  // with --checkpoint-dir, rank 0's
};

}  // namespace zerodp
