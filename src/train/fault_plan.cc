// fault_plan.h is the contract.
#include "train/fault_plan.h"

#include <chrono>
#include <csignal>
#include <limits>
#include <new>
#include <thread>

#include <fmt/core.h>

#include "core/error.h"
#include "train/flat.h"
#include "train/stop.h"

namespace zerodp {

FaultPlan::FaultPlan(std::span<const Injection> injections, int rank, double timeout_seconds)
    : rank_(rank), timeout_seconds_(timeout_seconds) {
  for (const Injection& i : injections) {
    if (i.rank == rank) mine_.push_back(i);
  }
}

bool FaultPlan::at(Injection::Kind kind, int64_t step) const {
  for (const Injection& i : mine_) {
    if (i.kind == kind && i.step == step) return true;
  }
  return false;
}

void FaultPlan::step_start(int64_t step) const {
  if (mine_.empty()) return;
  using Kind = Injection::Kind;
  if (at(Kind::kKill, step)) ::raise(SIGKILL);
  // As SIGTERM arriving at this rank alone: the others learn of it in this step's exchange.
  if (at(Kind::kTerm, step)) request_stop(SIGTERM);
  if (at(Kind::kThrow, step)) {
    throw Error(fmt::format("injected failure (--inject throw@{}:{})", step, rank_));
  }
  // An allocation failing at run time: what the preflight cannot rule out.
  if (at(Kind::kOom, step)) throw std::bad_alloc();
  if (at(Kind::kHang, step)) {
    // Not arriving: past the collective timeout the peers give up and abort the world, and
    // this rank's next collective fails with their verdict (under MPI the job is ended first).
    std::this_thread::sleep_for(std::chrono::duration<double>(timeout_seconds_ + 1.0));
  }
}

void FaultPlan::gradients_reduced(int64_t step, ShardedState& state) const {
  if (!at(Injection::Kind::kNan, step)) return;
  // One element of this rank's gradient shard, in the last unit that owns any.
  std::vector<UnitState>& units = state.units();
  for (size_t i = units.size(); i-- > 0;) {
    UnitState& u = units[i];
    if (u.own.count() == 0) continue;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    narrow(std::span<const float>(&nan, 1), u.grads.data(), u.grads.dtype, u.grads_own);
    return;
  }
}

void FaultPlan::shard_write(int64_t step, const std::filesystem::path& file) const {
  if (const double delay = shard_write_delay(step); delay > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
  }
  shard_write_failure(step, file);
}

double FaultPlan::shard_write_delay(int64_t step) const {
  return at(Injection::Kind::kSlowIo, step) ? kSlowWriteSeconds : 0;
}

void FaultPlan::shard_write_failure(int64_t step, const std::filesystem::path& file) const {
  if (at(Injection::Kind::kIo, step)) {
    throw IoError(fmt::format("cannot write {}: injected failure (--inject io@{}:{})",
                              file.string(), step, rank_));
  }
}

void FaultPlan::commit(int64_t step, const std::filesystem::path& dir) const {
  if (at(Injection::Kind::kSlowCommit, step)) {
    std::this_thread::sleep_for(std::chrono::duration<double>(kSlowWriteSeconds));
  }
  if (at(Injection::Kind::kCommitIo, step)) {
    throw IoError(fmt::format("cannot commit into {}: injected failure (--inject commitio@{}:{})",
                              dir.string(), step, rank_));
  }
}

}  // namespace zerodp
