// The islands whose states a rank holds, as one collection the step, saves, loads and
// --init-from iterate: one island, or with --islands-in-turn every island of the run
// (DiLoCo, train/outer_step.h).
//
// One ShardedState serves them all: the active island's units are in it and the others'
// are parked here, so every part that holds a reference to the state (reducer, optimizer,
// outer step, gathers, the stores) follows the active island with no change of its own, and
// the transient buffers exist once. Island 0 is active outside an iteration (evaluation, the
// weights hash, a cluster's rank 0 reporting), and for_each puts it back however the
// iteration ends, a throw included, so no caller switches islands or switches back.
//
// Offloaded, each island has its own OffloadTier (its own file); the tiers share island 0's
// staging, as their streams never overlap. store() streams from the active island's tier, or
// from memory.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "train/offload.h"
#include "train/sharded_state.h"
#include "train/state_store.h"

namespace zerodp {

class HeldIslands {
 public:
  // Island 0's states are `state`'s units; offloaded, `tier` holds its master and moments
  // (null: in memory). `state` and `tier` must outlive the collection.
  HeldIslands(ShardedState& state, std::unique_ptr<OffloadTier> tier);
  HeldIslands(const HeldIslands&) = delete;
  HeldIslands& operator=(const HeldIslands&) = delete;

  // One more island, the next index: its units (laid out as island 0's) and its tier, null
  // exactly when island 0 has none.
  void add(std::vector<UnitState> units, std::unique_ptr<OffloadTier> tier);

  int size() const { return static_cast<int>(parked_.size()); }
  int active() const { return active_; }
  // Calls f(v) for every island v in order, with v's states active in state() and store();
  // island 0 is active again once it returns or throws.
  void for_each(const std::function<void(int)>& f);
  // Called before the states change hands: an update still streaming the active island's
  // states (--offload-overlap) must end first.
  void set_before_switch(std::function<void()> f) { before_switch_ = std::move(f); }

  // The active island's states.
  ShardedState& state() { return state_; }
  const ShardedState& state() const { return state_; }
  // Where the active island's states live, to stream them from.
  StateStore& store() { return store_; }
  // The active island's tier; null when the states are in memory.
  OffloadTier* offload() { return tiers_.empty() ? nullptr : tiers_[index(active_)].get(); }
  const OffloadTier* offload() const {
    return tiers_.empty() ? nullptr : tiers_[index(active_)].get();
  }
  // What every island's tier has moved.
  OffloadTier::Counters offload_counters() const;

 private:
  static size_t index(int v) { return static_cast<size_t>(v); }
  // Puts island v's units into state_ and points the store at its tier. for_each is its only
  // caller, so island 0 is always restored.
  void activate_island(int v);
  // The swap itself, nothing settled first.
  void swap_in(int v);

  // Streams to whichever store the active island's states are in.
  class ActiveStore final : public StateStore {
   public:
    explicit ActiveStore(StateStore* target) : target_(target) {}
    void point_at(StateStore* target) { target_ = target; }
    void stream(std::span<const Job> jobs, Access access,
                const std::function<void(Piece&)>& f) override {
      target_->stream(jobs, access, f);
    }
    uint64_t bytes_moved() const override { return target_->bytes_moved(); }
    void count_update(uint64_t bytes, double seconds) override {
      target_->count_update(bytes, seconds);
    }

   private:
    StateStore* target_;
  };

  ShardedState& state_;
  // Island v's units while another is active; the active one's are in state_, its slot empty.
  std::vector<std::vector<UnitState>> parked_;
  int active_ = 0;
  // One tier per island (offloaded), else none.
  std::vector<std::unique_ptr<OffloadTier>> tiers_;
  MemoryStore memory_;  // the store when nothing is offloaded
  ActiveStore store_;
  std::function<void()> before_switch_;
};

}  // namespace zerodp
