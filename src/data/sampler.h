// DistributedSampler: which training samples each rank reads, for every step.
//
// Order. Epoch e visits the dataset in the order epoch_order(size, seed, e): a Fisher-Yates
// shuffle of 0..S-1 driven by splitmix64 seeded from (seed, e) (data/random.h), so the
// order is a pure function of (seed, epoch) and identical on every platform.
//
// Steps. An optimizer step takes K = N * b * A consecutive positions of the epoch order
// (N ranks, micro-batch b, A accumulation micro-steps): step s of an epoch covers
// positions [s*K, (s+1)*K). Within it, micro-step k is the global batch of positions
// s*K + k*G + [0, G) with G = N * b, and rank r reads the contiguous slice
// s*K + k*G + r*b + [0, b) of it. Hence:
//   - the ranks' slices of a micro-step are disjoint and their concatenation in rank order
//     is the global batch;
//   - the global batch of a micro-step depends on G, never on how G splits into N x b,
//     and the samples of an optimizer step depend only on K;
//   - accumulation is the sampler's business: an optimizer step never straddles epochs.
// Islands (DiLoCo, I islands of n = N / I consecutive ranks): island j takes the contiguous
// block s*K + j*(K/I) + [0, K/I) of the step, and inside it the layout above over its n
// ranks (rank r = j*n + l reads s*K + j*(K/I) + k*n*b + l*b + [0, b)). What an island reads
// depends on its micro-batches per step (n*A), never on how they split into n x A.
// Epoch boundary. An epoch has floor(S / K) steps; the S mod K positions left at its end
// are dropped, so every batch is full. The dropped samples differ from epoch to epoch,
// since the order is reshuffled.
//
// Position. The sampler's cursor is (epoch, step within the epoch), the next optimizer
// step to take: the data state a checkpoint saves. Restoring it with set_position()
// reproduces the sequence exactly; with another N, each step still reads the same samples
// as long as the dataset, the seed and N*b*A are kept (only their split over ranks moves).
//
// Cost: the current epoch's order is materialized, O(S) time once per epoch and 8*S bytes;
// with SamplerOptions::keyed none is: each position is a keyed permutation's, O(1).
//
// Thread safety: const methods may be called from several rank threads at once (the
// current epoch's order is cached behind a mutex); the cursor (advance, set_position) is
// not synchronized: one owner moves it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace zerodp {

// The epoch's visiting order: a permutation of 0..size-1, a pure function of its args.
std::vector<uint64_t> epoch_order(uint64_t size, uint64_t seed, uint64_t epoch);

struct SamplerOptions {
  uint64_t dataset_size = 0;  // S: training samples
  int world_size = 1;         // N
  int64_t micro_batch = 1;    // b: samples per rank per micro-step
  int64_t grad_accum = 1;     // A: micro-steps per optimizer step
  uint64_t seed = 0;
  int islands = 1;  // I: must divide N
  // The epoch's order from KeyedPermutation (data/keyed_order.h), computed per position in
  // O(1) memory, instead of epoch_order's stored shuffle: for token shards, whose sample
  // count grows with the corpus. Another order of the same samples: the in-memory sources
  // keep epoch_order (their reference hashes depend on it).
  bool keyed = false;
};

struct SamplerPosition {
  uint64_t epoch = 0;
  uint64_t step = 0;  // optimizer steps already taken in this epoch
  bool operator==(const SamplerPosition&) const = default;
};

class DistributedSampler {
 public:
  // Throws InvalidArgument when N, b or A is below 1, or one optimizer step (N*b*A) needs
  // more samples than the dataset holds (naming the values and the largest b that fits).
  explicit DistributedSampler(const SamplerOptions& options);
  ~DistributedSampler();
  DistributedSampler(DistributedSampler&&) noexcept;
  DistributedSampler& operator=(DistributedSampler&&) noexcept;

  const SamplerOptions& options() const { return options_; }
  uint64_t global_batch() const;      // G = N * b, one micro-step over all ranks
  uint64_t samples_per_step() const;  // K = N * b * A, one optimizer step
  uint64_t steps_per_epoch() const;   // floor(S / K)

  // Pure functions of (seed, position); throw InvalidArgument when position.step is not
  // below steps_per_epoch(), micro_step not in [0, A) or rank not in [0, N).
  // Rank `rank`'s b sample indices in micro-step `micro_step` of the step at `position`.
  std::vector<uint64_t> rank_samples(SamplerPosition position, int64_t micro_step, int rank) const;
  void rank_samples(SamplerPosition position, int64_t micro_step, int rank,
                    std::span<uint64_t> out) const;  // out.size() == b
  // The G sample indices of a micro-step, ranks' slices in rank order (with islands, not
  // one contiguous run of the epoch order).
  std::vector<uint64_t> global_samples(SamplerPosition position, int64_t micro_step) const;
  // All K sample indices of an optimizer step, micro-steps in order.
  std::vector<uint64_t> step_samples(SamplerPosition position) const;

  // The cursor.
  SamplerPosition position() const { return position_; }
  // Throws InvalidArgument, naming the position and the epoch's length, when step is not
  // below steps_per_epoch() (a checkpoint from another dataset or batch size).
  void set_position(SamplerPosition position);
  // Moves to the next optimizer step, wrapping into the next epoch after the last one.
  void advance();
  // The position after `steps` optimizer steps from the start, and back.
  SamplerPosition position_after(uint64_t steps) const;
  uint64_t steps_before(SamplerPosition position) const;

 private:
  struct OrderCache;
  uint64_t first_position(SamplerPosition position, int64_t micro_step, int rank) const;
  // Positions [first, first + out.size()) of epoch `epoch`'s order.
  void copy_order(uint64_t epoch, uint64_t first, std::span<uint64_t> out) const;

  SamplerOptions options_;
  SamplerPosition position_;
  std::unique_ptr<OrderCache> cache_;
};

}  // namespace zerodp
