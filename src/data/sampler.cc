#include "data/sampler.h"

#include <algorithm>
#include <numeric>

#include <fmt/core.h>

#include "core/error.h"
#include "core/mutex.h"
#include "data/keyed_order.h"
#include "data/random.h"

namespace zerodp {

std::vector<uint64_t> epoch_order(uint64_t size, uint64_t seed, uint64_t epoch) {
  std::vector<uint64_t> order(size);
  std::iota(order.begin(), order.end(), uint64_t{0});
  data_random::SplitMix64 rng(
      data_random::derive_key(seed, data_random::Stream::kEpochShuffle, epoch));
  // Fisher-Yates from the back: every permutation equally likely, given unbiased below().
  for (uint64_t i = size; i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  return order;
}

// The last epoch's order, shared by the rank threads that sample from one sampler.
struct DistributedSampler::OrderCache {
  Mutex mutex;
  bool valid GUARDED_BY(mutex) = false;
  uint64_t epoch GUARDED_BY(mutex) = 0;
  std::vector<uint64_t> order GUARDED_BY(mutex);

  // Epoch `e`'s order of `size` samples under `seed`, computed once per epoch.
  const std::vector<uint64_t>& of(uint64_t e, uint64_t size, uint64_t seed) REQUIRES(mutex) {
    if (!valid || epoch != e) {
      order = epoch_order(size, seed, e);
      epoch = e;
      valid = true;
    }
    return order;
  }
};

DistributedSampler::DistributedSampler(const SamplerOptions& options)
    : options_(options), cache_(std::make_unique<OrderCache>()) {
  const uint64_t S = options.dataset_size;
  if (options.world_size < 1 || options.micro_batch < 1 || options.grad_accum < 1) {
    throw InvalidArgument(fmt::format(
        "sampler: world size {}, micro-batch {} and accumulation {} must each be 1 or more",
        options.world_size, options.micro_batch, options.grad_accum));
  }
  if (options.islands < 1 || options.world_size % options.islands != 0) {
    throw InvalidArgument(fmt::format("sampler: {} islands do not divide a world of {} ranks",
                                      options.islands, options.world_size));
  }

  const auto N = static_cast<uint64_t>(options.world_size);
  const auto b = static_cast<uint64_t>(options.micro_batch);
  const auto A = static_cast<uint64_t>(options.grad_accum);
  // Division instead of multiplication: a huge request cannot overflow into a small one.
  if (b > S / N / A) {
    const uint64_t fit = S / N / A;
    throw InvalidArgument(fmt::format(
        "sampler: one step needs {} ranks x micro-batch {} x accumulation {} samples, more than "
        "the {} training samples{}",
        N, b, A, S,
        fit >= 1 ? fmt::format("; a micro-batch of at most {} fits", fit)
                 : std::string("; use fewer ranks or accumulation steps, or more data")));
  }
}

DistributedSampler::~DistributedSampler() = default;
DistributedSampler::DistributedSampler(DistributedSampler&&) noexcept = default;
DistributedSampler& DistributedSampler::operator=(DistributedSampler&&) noexcept = default;

uint64_t DistributedSampler::global_batch() const {
  return static_cast<uint64_t>(options_.world_size) * static_cast<uint64_t>(options_.micro_batch);
}

uint64_t DistributedSampler::samples_per_step() const {
  return global_batch() * static_cast<uint64_t>(options_.grad_accum);
}

uint64_t DistributedSampler::steps_per_epoch() const {
  return options_.dataset_size / samples_per_step();
}

uint64_t DistributedSampler::first_position(SamplerPosition position, int64_t micro_step,
                                            int rank) const {
  if (position.step >= steps_per_epoch()) {
    throw InvalidArgument(fmt::format(
        "sampler: step {} of epoch {} is past the {} steps of an epoch ({} samples, {} per step)",
        position.step, position.epoch, steps_per_epoch(), options_.dataset_size,
        samples_per_step()));
  }
  if (micro_step < 0 || micro_step >= options_.grad_accum) {
    throw InvalidArgument(fmt::format("sampler: micro-step {} is outside 0..{}", micro_step,
                                      options_.grad_accum - 1));
  }
  if (rank < 0 || rank >= options_.world_size) {
    throw InvalidArgument(
        fmt::format("sampler: rank {} is outside a world of {} ranks", rank, options_.world_size));
  }
  const uint64_t n = static_cast<uint64_t>(options_.world_size / options_.islands);
  const uint64_t island = static_cast<uint64_t>(rank) / n;
  const uint64_t local = static_cast<uint64_t>(rank) % n;
  const uint64_t b = static_cast<uint64_t>(options_.micro_batch);
  return position.step * samples_per_step() +
         island * (n * b * static_cast<uint64_t>(options_.grad_accum)) +
         static_cast<uint64_t>(micro_step) * n * b + local * b;
}

void DistributedSampler::rank_samples(SamplerPosition position, int64_t micro_step, int rank,
                                      std::span<uint64_t> out) const {
  const uint64_t first = first_position(position, micro_step, rank);
  if (out.size() != static_cast<uint64_t>(options_.micro_batch)) {
    throw InvalidArgument(fmt::format("sampler: output holds {} indices, the micro-batch is {}",
                                      out.size(), options_.micro_batch));
  }
  copy_order(position.epoch, first, out);
}

void DistributedSampler::copy_order(uint64_t epoch, uint64_t first, std::span<uint64_t> out) const {
  if (options_.keyed) {
    KeyedPermutation(options_.dataset_size, options_.seed, epoch).permute(first, out);
    return;
  }
  MutexLock lock(cache_->mutex);
  const std::vector<uint64_t>& order = cache_->of(epoch, options_.dataset_size, options_.seed);
  std::copy_n(order.begin() + static_cast<std::ptrdiff_t>(first), out.size(), out.begin());
}

std::vector<uint64_t> DistributedSampler::rank_samples(SamplerPosition position, int64_t micro_step,
                                                       int rank) const {
  std::vector<uint64_t> out(static_cast<size_t>(options_.micro_batch));
  rank_samples(position, micro_step, rank, out);
  return out;
}

std::vector<uint64_t> DistributedSampler::global_samples(SamplerPosition position,
                                                         int64_t micro_step) const {
  std::vector<uint64_t> all;
  for (int r = 0; r < options_.world_size; ++r) {
    const std::vector<uint64_t> mine = rank_samples(position, micro_step, r);
    all.insert(all.end(), mine.begin(), mine.end());
  }
  return all;
}

std::vector<uint64_t> DistributedSampler::step_samples(SamplerPosition position) const {
  std::vector<uint64_t> out(samples_per_step());
  copy_order(position.epoch, first_position(position, 0, 0), out);
  return out;
}

void DistributedSampler::set_position(SamplerPosition position) {
  if (position.step >= steps_per_epoch()) {
    throw InvalidArgument(fmt::format(
        "sampler: cannot resume at step {} of epoch {}: an epoch has {} steps ({} samples, {} "
        "per step); was the checkpoint made with another dataset, batch or world size?",
        position.step, position.epoch, steps_per_epoch(), options_.dataset_size,
        samples_per_step()));
  }
  position_ = position;
}

void DistributedSampler::advance() {
  if (++position_.step == steps_per_epoch()) {
    position_.step = 0;
    ++position_.epoch;
  }
}

SamplerPosition DistributedSampler::position_after(uint64_t steps) const {
  return SamplerPosition{.epoch = steps / steps_per_epoch(), .step = steps % steps_per_epoch()};
}

uint64_t DistributedSampler::steps_before(SamplerPosition position) const {
  return position.epoch * steps_per_epoch() + position.step;
}

}  // namespace zerodp
