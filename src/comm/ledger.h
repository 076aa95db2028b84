// CommLedger: what one rank received from its peers, per kind of collective.
//
// Bytes are those a rank's peers actually sent it (the ring algorithm's volume), with w
// wire bytes per element, c_r elements owned by rank r of a buffer of C, N ranks:
//   reduce_scatter  (N-1) * c_r * w      all_gather  (C - c_r) * w
//   all_reduce      the two above, with the balanced partition of C, as one call
//   broadcast       C * w on every rank but the root
//   control         scalars: (N-1) * k * 8 for k doubles per rank (a barrier is k = 1)
// Summed over ranks each reduce-scatter or all-gather is (N-1) * C * w.
//
// Levels: with T ranks per node (CommOptions::node_ranks), the part of those bytes that came
// from peers on other nodes is counted apart, as cross_node_bytes:
//   reduce_scatter  (N-T) * c_r * w      all_gather  (C - c_node) * w
// (c_node: the elements the ranks of r's node own), the all-reduce both, a broadcast all
// of it when the root is on another node, control (N-T) * k * 8.
//
// Traffic is kept apart by phase, so a report can show what a training step costs
// separately from initialization, evaluation and checkpoints. Not thread-safe: owned and
// used by the rank's own thread.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace zerodp {

enum class CommKind : uint8_t { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kControl };
inline constexpr int kNumCommKinds = 5;
std::string_view comm_kind_name(CommKind kind);  // "all_reduce", "reduce_scatter", ...

enum class CommPhase : uint8_t { kTrain, kOther };

struct CommCounter {
  uint64_t calls = 0;
  uint64_t bytes = 0;
  uint64_t cross_node_bytes = 0;  // the part of `bytes` from peers on other nodes
  bool operator==(const CommCounter&) const = default;
};

class CommLedger {
 public:
  using Table = std::array<CommCounter, kNumCommKinds>;

  void record(CommKind kind, uint64_t bytes, uint64_t cross_node_bytes = 0) {
    auto& c = tables_[static_cast<int>(phase_)][static_cast<int>(kind)];
    c.calls += 1;
    c.bytes += bytes;
    c.cross_node_bytes += cross_node_bytes;
  }
  void set_phase(CommPhase phase) { phase_ = phase; }
  CommPhase phase() const { return phase_; }

  const Table& table(CommPhase phase) const { return tables_[static_cast<int>(phase)]; }
  const CommCounter& get(CommPhase phase, CommKind kind) const {
    return tables_[static_cast<int>(phase)][static_cast<int>(kind)];
  }
  // Sum over phases.
  CommCounter total(CommKind kind) const;
  // Bytes over all kinds but control, in one phase.
  uint64_t data_bytes(CommPhase phase) const;
  void reset() { tables_ = {}; }

 private:
  std::array<Table, 2> tables_{};
  CommPhase phase_ = CommPhase::kOther;
};

// Sets a phase for a scope and restores the previous one.
class CommPhaseScope {
 public:
  CommPhaseScope(CommLedger& ledger, CommPhase phase) : ledger_(ledger), saved_(ledger.phase()) {
    ledger_.set_phase(phase);
  }
  ~CommPhaseScope() { ledger_.set_phase(saved_); }
  CommPhaseScope(const CommPhaseScope&) = delete;
  CommPhaseScope& operator=(const CommPhaseScope&) = delete;

 private:
  CommLedger& ledger_;
  CommPhase saved_;
};

}  // namespace zerodp
