#include "data/sampler.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"

namespace zerodp {
namespace {

DistributedSampler make(uint64_t size, int world, int64_t micro_batch, int64_t accum = 1,
                        uint64_t seed = 1234) {
  return DistributedSampler(SamplerOptions{.dataset_size = size,
                                           .world_size = world,
                                           .micro_batch = micro_batch,
                                           .grad_accum = accum,
                                           .seed = seed});
}

std::string invalid_argument_message(const SamplerOptions& options) {
  try {
    DistributedSampler sampler(options);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected InvalidArgument";
  return "";
}

TEST(EpochOrder, IsAPermutation) {
  for (uint64_t size : {0u, 1u, 2u, 7u, 1000u}) {
    std::vector<uint64_t> order = epoch_order(size, 5, 3);
    std::sort(order.begin(), order.end());
    std::vector<uint64_t> expected(size);
    std::iota(expected.begin(), expected.end(), uint64_t{0});
    EXPECT_EQ(order, expected) << "size " << size;
  }
}

TEST(EpochOrder, PinnedValuesHoldOnEveryPlatform) {
  // Fixed integer arithmetic only: a change here changes every run's data order. The
  // values were cross-checked with an independent Python implementation of random.h.
  EXPECT_EQ(epoch_order(10, 42, 0), (std::vector<uint64_t>{5, 7, 6, 2, 0, 4, 1, 8, 3, 9}));
  EXPECT_EQ(epoch_order(10, 42, 1), (std::vector<uint64_t>{4, 6, 2, 5, 1, 3, 7, 0, 8, 9}));
}

TEST(EpochOrder, SameSeedSameOrderOtherEpochOrSeedDiffers) {
  EXPECT_EQ(epoch_order(500, 9, 4), epoch_order(500, 9, 4));
  EXPECT_NE(epoch_order(500, 9, 4), epoch_order(500, 9, 5));
  EXPECT_NE(epoch_order(500, 9, 4), epoch_order(500, 10, 4));
}

TEST(DistributedSampler, RankSlicesAreDisjointAndConcatenateToGlobalBatch) {
  for (int world : {1, 2, 3, 4, 5, 7, 8}) {
    for (int64_t micro : {1, 3, 4}) {
      for (int64_t accum : {1, 2}) {
        const auto sampler = make(211, world, micro, accum);
        for (uint64_t step = 0; step < sampler.steps_per_epoch(); step += 3) {
          for (int64_t k = 0; k < accum; ++k) {
            const SamplerPosition pos{.epoch = 2, .step = step};
            std::vector<uint64_t> joined;
            for (int r = 0; r < world; ++r) {
              const auto slice = sampler.rank_samples(pos, k, r);
              ASSERT_EQ(slice.size(), static_cast<size_t>(micro));
              joined.insert(joined.end(), slice.begin(), slice.end());
            }
            ASSERT_EQ(joined, sampler.global_samples(pos, k));
            const std::set<uint64_t> distinct(joined.begin(), joined.end());
            ASSERT_EQ(distinct.size(), joined.size()) << "world " << world;
            for (uint64_t i : joined) ASSERT_LT(i, 211u);
          }
        }
      }
    }
  }
}

// The keyed order (token shards): an epoch still visits every sample once, any split of a
// step over ranks reads the same samples, and it is KeyedPermutation's order, not the
// stored shuffle's.
TEST(DistributedSampler, AKeyedOrderCoversTheEpochAndIgnoresHowAStepSplits) {
  const uint64_t S = 1000;
  const auto step_samples = [&](int N, int64_t b, int64_t A) {
    DistributedSampler s(SamplerOptions{.dataset_size = S,
                                        .world_size = N,
                                        .micro_batch = b,
                                        .grad_accum = A,
                                        .seed = 9,
                                        .keyed = true});
    std::vector<uint64_t> all;
    for (uint64_t step = 0; step < s.steps_per_epoch(); ++step) {
      for (int64_t k = 0; k < A; ++k) {
        for (int r = 0; r < N; ++r) {
          for (uint64_t i : s.rank_samples({0, step}, k, r)) all.push_back(i);
        }
      }
    }
    return all;
  };
  const std::vector<uint64_t> one = step_samples(1, 8, 5);  // K = 40: 25 steps, all 1000
  EXPECT_EQ(step_samples(4, 2, 5), one);
  EXPECT_EQ(step_samples(2, 4, 5), one);
  EXPECT_EQ(std::set<uint64_t>(one.begin(), one.end()).size(), S);
  DistributedSampler stored(SamplerOptions{
      .dataset_size = S, .world_size = 1, .micro_batch = 8, .grad_accum = 5, .seed = 9});
  EXPECT_NE(stored.step_samples({0, 0}), std::vector<uint64_t>(one.begin(), one.begin() + 40));
}

TEST(DistributedSampler, GlobalBatchIsIndependentOfWorldSize) {
  // G = 12 = N * b for N = 1, 2, 3, 4: the union of the ranks' slices is the same batch.
  const std::vector<std::pair<int, int64_t>> shapes = {{1, 12}, {2, 6}, {3, 4}, {4, 3}};
  for (uint64_t epoch : {0u, 1u, 5u}) {
    for (uint64_t step : {0u, 1u, 7u, 82u}) {
      std::vector<uint64_t> reference;
      for (const auto& [world, micro] : shapes) {
        const auto sampler = make(1000, world, micro);
        ASSERT_EQ(sampler.steps_per_epoch(), 83u);
        std::vector<uint64_t> joined;
        for (int r = 0; r < world; ++r) {
          const auto slice = sampler.rank_samples({.epoch = epoch, .step = step}, 0, r);
          joined.insert(joined.end(), slice.begin(), slice.end());
        }
        if (reference.empty()) reference = joined;
        EXPECT_EQ(joined, reference) << "world " << world << " step " << step;
      }
    }
  }
}

TEST(DistributedSampler, OptimizerStepDependsOnlyOnSamplesPerStep) {
  // N*b*A = 12 in each: the step covers the same samples, micro-steps in order.
  const auto a = make(100, 2, 3, 2);
  const auto b = make(100, 1, 12, 1);
  const auto c = make(100, 3, 1, 4);
  for (uint64_t step = 0; step < a.steps_per_epoch(); ++step) {
    const SamplerPosition pos{.epoch = 1, .step = step};
    EXPECT_EQ(a.step_samples(pos), b.step_samples(pos));
    EXPECT_EQ(a.step_samples(pos), c.step_samples(pos));
  }
}

TEST(DistributedSampler, EpochVisitsEachSampleAtMostOnceAndDropsTheTail) {
  const auto sampler = make(103, 2, 5);  // 10 per step: 10 steps, 3 samples dropped
  ASSERT_EQ(sampler.steps_per_epoch(), 10u);
  std::set<uint64_t> seen;
  for (uint64_t step = 0; step < 10; ++step) {
    for (uint64_t i : sampler.step_samples({.epoch = 0, .step = step})) {
      EXPECT_TRUE(seen.insert(i).second) << "sample " << i << " read twice";
    }
  }
  EXPECT_EQ(seen.size(), 100u);
  // The dropped ones are the last three of the epoch's order.
  const auto order = epoch_order(103, 1234, 0);
  for (size_t p = 100; p < 103; ++p) EXPECT_EQ(seen.count(order[p]), 0u);
}

TEST(DistributedSampler, ReshufflesPerEpochReproduciblyFromTheSeed) {
  const auto a = make(500, 2, 8, 1, 77);
  const auto b = make(500, 2, 8, 1, 77);
  const auto other_seed = make(500, 2, 8, 1, 78);
  EXPECT_EQ(a.step_samples({.epoch = 0, .step = 0}), b.step_samples({.epoch = 0, .step = 0}));
  EXPECT_EQ(a.step_samples({.epoch = 3, .step = 5}), b.step_samples({.epoch = 3, .step = 5}));
  EXPECT_NE(a.step_samples({.epoch = 0, .step = 0}), a.step_samples({.epoch = 1, .step = 0}));
  EXPECT_NE(a.step_samples({.epoch = 0, .step = 0}),
            other_seed.step_samples({.epoch = 0, .step = 0}));
}

TEST(DistributedSampler, AdvanceWrapsIntoNextEpoch) {
  auto sampler = make(30, 2, 4);  // 8 per step: 3 steps per epoch
  EXPECT_EQ(sampler.position(), (SamplerPosition{0, 0}));
  for (int i = 0; i < 3; ++i) sampler.advance();
  EXPECT_EQ(sampler.position(), (SamplerPosition{1, 0}));
  sampler.advance();
  EXPECT_EQ(sampler.position(), (SamplerPosition{1, 1}));
  EXPECT_EQ(sampler.position_after(4), (SamplerPosition{1, 1}));
  EXPECT_EQ(sampler.position_after(9), (SamplerPosition{3, 0}));
  EXPECT_EQ(sampler.steps_before(sampler.position_after(11)), 11u);
}

TEST(DistributedSampler, RestoredPositionReproducesTheSequence) {
  auto run = [](DistributedSampler& s, int steps) {
    std::vector<std::vector<uint64_t>> out;
    for (int i = 0; i < steps; ++i) {
      for (int r = 0; r < s.options().world_size; ++r) {
        out.push_back(s.rank_samples(s.position(), 0, r));
      }
      s.advance();
    }
    return out;
  };
  auto original = make(50, 3, 2);  // 6 per step: 8 steps per epoch
  run(original, 11);
  const SamplerPosition saved = original.position();
  EXPECT_EQ(saved, (SamplerPosition{1, 3}));
  const auto expected = run(original, 20);

  auto resumed = make(50, 3, 2);
  resumed.set_position(saved);
  EXPECT_EQ(run(resumed, 20), expected);
}

TEST(DistributedSampler, ResumeWithAnotherWorldSizeKeepsGlobalOrder) {
  auto two = make(64, 2, 4);
  auto four = make(64, 4, 2);
  const SamplerPosition pos{.epoch = 2, .step = 5};
  four.set_position(pos);
  EXPECT_EQ(two.step_samples(pos), four.step_samples(four.position()));
}

// An island's samples, micro-batches in the island's order j = k * n + l.
std::vector<uint64_t> island_samples(const DistributedSampler& s, SamplerPosition pos, int island) {
  const int n = s.options().world_size / s.options().islands;
  std::vector<uint64_t> out;
  for (int64_t k = 0; k < s.options().grad_accum; ++k) {
    for (int l = 0; l < n; ++l) {
      const auto mine = s.rank_samples(pos, k, island * n + l);
      out.insert(out.end(), mine.begin(), mine.end());
    }
  }
  return out;
}

TEST(DistributedSampler, AnIslandReadsTheSameSamplesOnAnyRanksPerIsland) {
  const auto with = [](int world, int64_t accum) {
    return DistributedSampler(SamplerOptions{.dataset_size = 200,
                                             .world_size = world,
                                             .micro_batch = 3,
                                             .grad_accum = accum,
                                             .seed = 9,
                                             .islands = 2});
  };
  // 2 islands of 4 micro-batches per step: 1 x 4, 2 x 2 and 4 x 1 ranks x accumulation.
  const auto one = with(2, 4), two = with(4, 2), four = with(8, 1);
  for (uint64_t step = 0; step < one.steps_per_epoch(); ++step) {
    const SamplerPosition pos{.epoch = 1, .step = step};
    for (int island = 0; island < 2; ++island) {
      const auto expected = island_samples(one, pos, island);
      EXPECT_EQ(island_samples(two, pos, island), expected) << step << " " << island;
      EXPECT_EQ(island_samples(four, pos, island), expected) << step << " " << island;
    }
    // The islands split the step's samples between them, island 0's block first.
    auto both = island_samples(two, pos, 0);
    const auto second = island_samples(two, pos, 1);
    both.insert(both.end(), second.begin(), second.end());
    EXPECT_EQ(both, two.step_samples(pos));
  }
  EXPECT_NE(invalid_argument_message({.dataset_size = 200, .world_size = 3, .islands = 2})
                .find("2 islands do not divide a world of 3"),
            std::string::npos);
}

TEST(DistributedSampler, InvalidPositionsAreRejected) {
  auto sampler = make(30, 2, 4);
  EXPECT_THROW(sampler.set_position({.epoch = 0, .step = 3}), InvalidArgument);
  EXPECT_THROW(sampler.rank_samples({.epoch = 0, .step = 3}, 0, 0), InvalidArgument);
  EXPECT_THROW(sampler.rank_samples({.epoch = 0, .step = 0}, 1, 0), InvalidArgument);
  EXPECT_THROW(sampler.rank_samples({.epoch = 0, .step = 0}, 0, 2), InvalidArgument);
  EXPECT_THROW(sampler.rank_samples({.epoch = 0, .step = 0}, 0, -1), InvalidArgument);
  std::vector<uint64_t> wrong_size(3);
  EXPECT_THROW(sampler.rank_samples({.epoch = 0, .step = 0}, 0, 0, wrong_size), InvalidArgument);
}

TEST(DistributedSampler, BatchLargerThanDatasetSaysWhatFits) {
  const std::string what = invalid_argument_message(
      {.dataset_size = 10, .world_size = 2, .micro_batch = 8, .grad_accum = 1, .seed = 0});
  EXPECT_NE(what.find("2 ranks x micro-batch 8"), std::string::npos) << what;
  EXPECT_NE(what.find("10 training samples"), std::string::npos) << what;
  EXPECT_NE(what.find("at most 5"), std::string::npos) << what;
  const std::string none_fit = invalid_argument_message(
      {.dataset_size = 3, .world_size = 4, .micro_batch = 1, .grad_accum = 1, .seed = 0});
  EXPECT_NE(none_fit.find("fewer ranks"), std::string::npos) << none_fit;
  // Huge values must not overflow into an accepted product.
  EXPECT_THROW(make(100, 4, int64_t{1} << 62, 4), InvalidArgument);
}

TEST(DistributedSampler, NonPositiveShapesAreRejected) {
  for (const auto& [world, micro, accum] : std::vector<std::tuple<int, int64_t, int64_t>>{
           {0, 1, 1}, {1, 0, 1}, {1, 1, 0}, {-2, 1, 1}}) {
    const std::string what = invalid_argument_message(
        {.dataset_size = 100, .world_size = world, .micro_batch = micro, .grad_accum = accum});
    EXPECT_NE(what.find("must each be 1 or more"), std::string::npos) << what;
  }
}

TEST(DistributedSampler, ConstQueriesAreSafeFromRankThreads) {
  const auto sampler = make(1000, 4, 5);
  std::vector<std::vector<uint64_t>> got(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      for (uint64_t epoch = 0; epoch < 3; ++epoch) {
        for (uint64_t step = 0; step < sampler.steps_per_epoch(); step += 7) {
          const auto s = sampler.rank_samples({.epoch = epoch, .step = step}, 0, r);
          got[static_cast<size_t>(r)].insert(got[static_cast<size_t>(r)].end(), s.begin(), s.end());
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  const auto fresh = make(1000, 4, 5);
  for (int r = 0; r < 4; ++r) {
    std::vector<uint64_t> expected;
    for (uint64_t epoch = 0; epoch < 3; ++epoch) {
      for (uint64_t step = 0; step < fresh.steps_per_epoch(); step += 7) {
        const auto s = fresh.rank_samples({.epoch = epoch, .step = step}, 0, r);
        expected.insert(expected.end(), s.begin(), s.end());
      }
    }
    EXPECT_EQ(got[static_cast<size_t>(r)], expected) << "rank " << r;
  }
}

}  // namespace
}  // namespace zerodp
