// holdings.h is the contract.
#include "train/holdings.h"

#include "train/outer_layout.h"

namespace zerodp {

PlannedModel planned_model(const Model& model) {
  PlannedModel m{.tensors = unit_tensors(model), .model = &model};
  for (const auto& u : model) m.units.push_back(u->numel());
  return m;
}

uint64_t Holdings::memory() const {
  return states.total() + (transients ? transients->total() : 0) + outer_state + checkpoint_staging;
}

MemoryLedger::Table Holdings::by_category() const {
  MemoryLedger::Table t{};
  const auto set = [&t](MemCategory c, uint64_t bytes) { t[static_cast<size_t>(c)] = bytes; };
  set(MemCategory::kParams, states.params);
  set(MemCategory::kGrads, states.grads);
  set(MemCategory::kMaster, states.master);
  set(MemCategory::kAdamM, states.adam_m);
  set(MemCategory::kAdamV, states.adam_v);
  if (transients) {
    const TransientBytes& b = *transients;
    set(MemCategory::kActivations, b.activations);
    set(MemCategory::kWorkspace, b.workspace);
    set(MemCategory::kGathered, b.gathered);
    set(MemCategory::kGradBuckets, b.grad_buckets);
    set(MemCategory::kGradAccum, b.grad_accum);
    set(MemCategory::kCommBuffers, b.comm_buffers);
    set(MemCategory::kHpzParams, b.hpz_params);
    set(MemCategory::kOffloadStaging, b.offload_staging);
  }
  set(MemCategory::kOuterState, outer_state);
  set(MemCategory::kCheckpointStaging, checkpoint_staging);
  return t;
}

Holdings rank_holdings(const TrainConfig& c, const PlannedModel& m, int world, int rank) {
  // A copy of the states is sharded over an island's ranks, a node's (HSDP) or the world's,
  // and the rank holds one copy per island it hosts.
  const int shards = shard_ranks(c, world), index = shard_index(c, world, rank);
  const auto hosted = static_cast<uint64_t>(hosted_islands(c));
  const UnitTensors* tensors = m.tensors.size() == m.units.size() ? &m.tensors : nullptr;
  const LayoutBytes layout = layout_bytes(layout_plan(c), m.units, tensors, shards, index);
  Holdings h;
  h.states = state_bytes(layout).times(hosted);
  h.outer_state = layout[MemCategory::kOuterState] * hosted;
  if (c.islands > 1) h.outer_state += outer_layout(m.units, island_layout(c, world), rank).bytes();
  h.checkpoint_staging = checkpoint_staging_bytes(m.units, c, world, rank, tensors);
  if (m.model != nullptr) {
    // The buffers are the active island's, shared by every island hosted.
    h.transients =
        transient_bytes(*m.model, transient_plan(c, shards, m.features_per_sample), index);
  }
  return h;
}

}  // namespace zerodp
