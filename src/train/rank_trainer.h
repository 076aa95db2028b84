// One rank's training: the one step loop that serves every ZeRO stage, assembled from the
// parts that do the work.
//
//   ShardedState     (sharded_state.h)   the model states this rank holds, and their offsets
//   StagePlan        (stage_plan.h)      what the stage makes the loop do
//   GatherQueue      (gather_queue.h)    stage 3's parameter gathers ahead of compute, from
//                                        the pass's GatherSource
//   StateStore       (state_store.h)     where the states live: memory, or the offload file
//   HeldIslands      (held_islands.h)    the islands whose states the rank holds, visited in
//                                        turn by the step, saves, loads and --init-from
//   GradientReducer  (grad_reducer.h)    micro-batch gradients to the averaged gradient
//   OptimizerStep    (optimizer_step.h)  clipping, loss scaling, AdamW, rounding back, gathers
//   OuterStep        (outer_step.h)      DiLoCo's islands meeting every H steps (--islands)
//   FaultPlan        (fault_plan.h)      --inject's hook points
//
// One step: A micro-batches of forward and backward over the units (each unit's weights
// widened to fp32, or read from the stored bf16 copy by bf16 products), gradients handed to
// the reducer as each unit's backward produces them; then one control exchange in which the
// ranks agree on the norm, on whether any gradient or loss was non-finite, and on a stop
// request; then the optimizer step. Every rank runs the same sequence of collectives.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/sha256.h"
#include "data/sampler.h"
#include "data/source.h"
#include "memory/ledger.h"
#include "models/model.h"
#include "tensor/gemm.h"
#include "train/config.h"
#include "train/fault_plan.h"
#include "train/gather_queue.h"
#include "train/grad_reducer.h"
#include "train/held_islands.h"
#include "train/offload.h"
#include "train/optimizer_step.h"
#include "train/outer_step.h"
#include "train/plan.h"
#include "train/result.h"
#include "train/sharded_state.h"
#include "train/trace.h"

namespace zerodp {

// Ranks sharing this machine's cores: every rank on the local backend; under MPI the
// launcher's count of this host's processes (OpenMPI, MPICH/Hydra) times the ranks each
// hosts, else the whole world.
int ranks_on_this_host(const Communicator& comm, const LaunchOptions& launch);

class RankTrainer {
 public:
  // Builds the model (make_model, or the one cfg names), allocates and initializes this
  // rank's states and buffers on its ledger. `cfg` and `data` must outlive the trainer.
  // With --islands, `island` and `column` are this rank's island and column
  // (train/outer_step.h): the states are sharded over the island, and the outer step runs
  // over the column; `comm` stays the world (the control exchange, evaluation, checkpoints).
  RankTrainer(const TrainConfig& cfg, Communicator& comm, const DataSplits& data,
              const ModelFactory& make_model, Communicator* island = nullptr,
              Communicator* column = nullptr);

  StepRecord step(int64_t step_index);
  // Mean loss over the first cfg.eval_batches validation micro-batches (fewer when the set
  // is smaller), shared among the ranks and folded in order; forward only. NaN when the
  // validation set is too small for one.
  double evaluate();
  // Waits until the last step's update is done with every state (it may still be streaming
  // under --offload-overlap): before reading or writing the states outside the step.
  void settle() { optimizer_.settle(); }
  // sha256 of the consolidated fp32 master weights, units and tensors in canonical order;
  // with `keep`, the weights too (collective: every rank calls it).
  std::string weights_sha256(std::vector<float>* keep);

  const TrainConfig& config() const { return cfg_; }
  const DataSplits& data() const { return data_; }
  Communicator& comm() { return comm_; }
  const Communicator& comm() const { return comm_; }
  const Model& model() const { return model_; }
  uint64_t params() const { return state_.params(); }
  MemoryLedger& ledger() { return ledger_; }
  std::string samples_sha256() const { return samples_hash_.hex_digest(); }
  // Every step's K sample indices so far, chained: chain = sha256(chain || each index as
  // le64), in the epoch order's positions, so the value depends on the samples read and
  // their order, never on how they split over ranks. A resume carries it on
  // (set_samples_chain); `from` is the step the chain started after.
  std::string samples_chain() const;
  uint64_t samples_chain_from() const { return samples_chain_from_; }
  // CorruptData-free: `hex` was checked when the checkpoint was read.
  void set_samples_chain(const std::string& hex, uint64_t from);
  ShardedState& state() { return state_; }
  // Where master, adam_m and adam_v live under --offload optimizer; null when in memory.
  // Islands in turn: the active island's.
  OffloadTier* offload() { return islands_.offload(); }
  const OffloadTier* offload() const { return islands_.offload(); }
  // What every island's tier has moved (one tier but with islands in turn).
  OffloadTier::Counters offload_counters() const { return islands_.offload_counters(); }
  // Where the states live, memory or the offload file, to stream them from.
  StateStore& store() { return islands_.store(); }
  const ShardGroup& group() const { return group_; }
  const ShardedState& state() const { return state_; }
  // DiLoCo's outer step; null without --islands.
  OuterStep* outer() { return outer_ ? &*outer_ : nullptr; }
  OptimizerStep& optimizer() { return optimizer_; }
  const OptimizerStep& optimizer() const { return optimizer_; }
  DistributedSampler& sampler() { return sampler_; }
  const DistributedSampler& sampler() const { return sampler_; }
  const FaultPlan& faults() const { return faults_; }
  void set_tracer(Tracer* t) { tracer_ = t; }
  Tracer* tracer() const { return tracer_; }
  // The islands this rank holds states of (--islands-in-turn: every island, else one), each
  // put in state() and store() while an iteration visits it. Outside one, island 0, whose
  // weights a run reports.
  HeldIslands& islands() { return islands_; }
  int hosted_islands() const { return islands_.size(); }

 private:
  // The active island's forward and backward passes over the step's micro-batches, its
  // gradient reduced; appends its part of the control exchange to control_.
  void island_pass(int64_t step_index);
  void load_micro_batch(int64_t micro);
  void prefetch_next_step();
  // This rank's place in the islands' world: rank r's for the active island v, v N + r.
  int virtual_rank() const { return islands_.active() * comm_.size() + comm_.rank(); }
  void fill_micro_batch(const Dataset& dataset, std::span<const uint64_t> idx);
  std::span<const float> weights_for(size_t ui, int slot);
  // The same weights as stored in bf16 (what weights_for widened), or empty.
  std::span<const BFloat16> stored_bf16(size_t ui, int slot) const;
  std::span<float> saved_for(size_t ui);
  double forward();
  // Where a pass's stage-3 gathers take each unit's parameters from (gather_queue.h).
  std::unique_ptr<GatherSource> gather_source(bool backward);
  // Before the forward reads unit i's parameters: the overlapped update has updated them.
  void wait_for_update(size_t i);
  void backward();

  // What a rank allocates besides its states and the reducer's buffers, from the layout the
  // planner also reads (train/plan.h), in the layout's order.
  struct Buffers {
    Buffers(MemoryLedger& ledger, const TransientLayout& layout, DType param_dtype);
    // Activations: the stream between units (stream[u] is unit u's input), what each unit
    // saves for its backward (one recompute buffer with activation checkpointing), the
    // micro-batch's inputs.
    std::vector<Buffer<float>> stream;
    std::vector<Buffer<float>> saved;
    Buffer<int32_t> tokens, targets;
    Buffer<float> features;
    // Workspace: weights widened to fp32, their gradient, the gradient flowing backward
    // (two, alternating), scratch.
    Buffer<float> w32, dw32, dx_a, dx_b, scratch;
    // Stage 3: gathered unit parameters.
    std::vector<Flat> gathered;
    // hpZ: each unit's share of this rank within its node (HpzCopy).
    std::vector<Flat> hpz;
    // qwZ: every rank's int8 payload of the unit in each gather slot (QuantizedGather).
    std::vector<Flat> qwz_staging;
  };

  const TrainConfig& cfg_;
  Communicator& comm_;
  ShardGroup group_;  // the ranks the states are sharded over
  GemmCompute compute_;
  Model model_;
  MemoryLedger ledger_;
  const DataSplits& data_;
  BatchShape shape_;
  TransientLayout layout_;
  DistributedSampler sampler_;
  ShardedState state_;
  HeldIslands islands_;
  Buffers buf_;
  std::optional<HpzCopy> hpz_;
  std::optional<QuantizedGather> qwz_;
  // Widening space for gradients on their way to the grads buffer and the optimizer: a fixed
  // 64 KiB, allocated with the trainer, so a step allocates nothing for them (outside the
  // ledger: part of the fixed RSS overhead docs/performance.md states).
  std::vector<float> chunk_ = std::vector<float>(16384);
  GradientReducer reducer_;
  OptimizerStep optimizer_;
  std::optional<OuterStep> outer_;
  FaultPlan faults_;
  Sha256 samples_hash_;
  double data_seconds_ = 0;  // reading samples, this step so far
  Sha256::Digest samples_chain_{};
  uint64_t samples_chain_from_ = 0;
  MicroBatch mb_;
  std::vector<double> losses_;   // the step's micro-batch losses; capacity kept
  std::vector<double> control_;  // the step's control exchange; capacity kept
  Tracer* tracer_ = nullptr;     // --trace: null when off
};

}  // namespace zerodp
