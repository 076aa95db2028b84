// The local backend's collectives against a plain reference, over world sizes 1..8,
// counts 0, 1, primes and large, ragged partitions, every dtype and op.
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "comm/local.h"
#include "comm_testing.h"
#include "core/error.h"

namespace zerodp::comm_test {
namespace {

template <typename T>
class CollectiveTest : public ::testing::Test {};
using DTypes = ::testing::Types<float, Float16, BFloat16>;
TYPED_TEST_SUITE(CollectiveTest, DTypes);

constexpr size_t kCounts[] = {0, 1, 2, 7, 13, 101, 4099, 100003};

TYPED_TEST(CollectiveTest, ReduceScatterMatchesReferenceForEveryWorldCountAndOp) {
  using T = TypeParam;
  for (int world = 1; world <= 8; ++world) {
    for (size_t count : kCounts) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        const Partition part(count, world);
        std::mutex mu;
        int wrong = 0;
        run_local(world, kOptions, [&](Communicator& comm) {
          const auto in = make_input<T>(comm.rank(), count);
          std::vector<T> out(part.count(comm.rank()));
          comm.reduce_scatter(std::span<const T>(in), std::span<T>(out), part, op);
          int bad = 0;
          for (size_t j = 0; j < out.size(); ++j) {
            const T want = reference_reduce<T>(world, part.offset(comm.rank()) + j, op);
            if (!same_bits(out[j], want)) ++bad;
          }
          std::lock_guard lock(mu);
          wrong += bad;
        });
        EXPECT_EQ(wrong, 0) << "world " << world << " count " << count << " op "
                            << reduce_op_name(op);
      }
    }
  }
}

TYPED_TEST(CollectiveTest, AllReduceEqualsReduceScatterThenAllGatherByteForByte) {
  using T = TypeParam;
  for (int world : {1, 2, 3, 5, 8}) {
    for (size_t count : kCounts) {
      std::mutex mu;
      int wrong = 0;
      run_local(world, kOptions, [&](Communicator& comm) {
        auto reduced = make_input<T>(comm.rank(), count);
        comm.all_reduce(std::span<T>(reduced), ReduceOp::kAvg);

        const Partition part(count, world);
        const auto in = make_input<T>(comm.rank(), count);
        std::vector<T> shard(part.count(comm.rank()));
        std::vector<T> gathered(count);
        comm.reduce_scatter(std::span<const T>(in), std::span<T>(shard), part, ReduceOp::kAvg);
        comm.all_gather(std::span<const T>(shard), std::span<T>(gathered), part);
        const bool equal =
            count == 0 || std::memcmp(reduced.data(), gathered.data(), count * sizeof(T)) == 0;
        int bad_vs_reference = 0;
        for (size_t i = 0; i < count; ++i) {
          if (!same_bits(reduced[i], reference_reduce<T>(world, i, ReduceOp::kAvg))) {
            ++bad_vs_reference;
          }
        }
        std::lock_guard lock(mu);
        wrong += (equal ? 0 : 1) + bad_vs_reference;
      });
      EXPECT_EQ(wrong, 0) << "world " << world << " count " << count;
    }
  }
}

TYPED_TEST(CollectiveTest, AllGatherPlacesEveryShardAtItsRangeIncludingEmptyRanges) {
  using T = TypeParam;
  const size_t counts[] = {3, 0, 5, 0, 1};
  const Partition part = Partition::from_counts(counts);
  std::mutex mu;
  int wrong = 0;
  run_local(5, kOptions, [&](Communicator& comm) {
    const auto full = make_input<T>(99, part.length());  // the same buffer on every rank
    const Range mine = part.range(comm.rank());
    std::vector<T> shard(full.begin() + static_cast<std::ptrdiff_t>(mine.begin),
                         full.begin() + static_cast<std::ptrdiff_t>(mine.end));
    std::vector<T> out(part.length());
    comm.all_gather(std::span<const T>(shard), std::span<T>(out), part);
    const bool ok = std::memcmp(out.data(), full.data(), full.size() * sizeof(T)) == 0;
    std::lock_guard lock(mu);
    wrong += ok ? 0 : 1;
  });
  EXPECT_EQ(wrong, 0);
}

TYPED_TEST(CollectiveTest, InPlaceReduceScatterAndAllGatherUseTheOwnRange) {
  using T = TypeParam;
  for (int world : {2, 3, 4, 7}) {
    const size_t count = 1009;
    const Partition part(count, world);
    std::mutex mu;
    int wrong = 0;
    run_local(world, kOptions, [&](Communicator& comm) {
      auto buf = make_input<T>(comm.rank(), count);
      const Range mine = part.range(comm.rank());
      std::span<T> own(buf.data() + mine.begin, mine.count());
      comm.reduce_scatter(std::span<const T>(buf), own, part, ReduceOp::kSum);
      comm.all_gather(std::span<const T>(own), std::span<T>(buf), part);
      int bad = 0;
      for (size_t i = 0; i < count; ++i) {
        if (!same_bits(buf[i], reference_reduce<T>(world, i, ReduceOp::kSum))) ++bad;
      }
      std::lock_guard lock(mu);
      wrong += bad;
    });
    EXPECT_EQ(wrong, 0) << "world " << world;
  }
}

TEST(Collectives, BroadcastFromEveryRoot) {
  for (int world : {1, 2, 3, 6}) {
    for (int root = 0; root < world; ++root) {
      std::mutex mu;
      int wrong = 0;
      run_local(world, kOptions, [&](Communicator& comm) {
        auto buf = make_input<float>(comm.rank(), 777);
        comm.broadcast(std::span<float>(buf), root);
        const auto want = make_input<float>(root, 777);
        std::lock_guard lock(mu);
        wrong += buf == want ? 0 : 1;
      });
      EXPECT_EQ(wrong, 0) << "world " << world << " root " << root;
    }
  }
}

TEST(Collectives, AsyncWorkCompletesInIssueOrderAndWaitIsRepeatable) {
  run_local(4, kOptions, [&](Communicator& comm) {
    const size_t count = 50000;
    std::vector<std::vector<float>> bufs;
    for (int k = 0; k < 6; ++k) bufs.push_back(make_input<float>(comm.rank() + k, count));
    std::vector<Work> works;
    for (auto& b : bufs)
      works.push_back(comm.all_reduce_async(std::span<float>(b), ReduceOp::kSum));
    for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();
    for (auto& w : works) {
      w.wait();
      EXPECT_TRUE(w.ready());
    }
    // Rank 0's buffer k must equal everyone's: the sum over ranks of input(rank + k).
    std::vector<float> check = bufs[2];
    comm.broadcast(std::span<float>(check), 0);
    EXPECT_EQ(check, bufs[2]);
  });
}

TEST(Collectives, ControlValuesAreGatheredRankMajorAndSummedInRankOrder) {
  run_local(3, kOptions, [&](Communicator& comm) {
    const double mine[] = {static_cast<double>(comm.rank()), 10.0 * comm.rank() + 0.5};
    const auto all = comm.gather_control(mine);
    ASSERT_EQ(all.size(), 6u);
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(all[2 * r], r);
      EXPECT_EQ(all[2 * r + 1], 10.0 * r + 0.5);
    }
    EXPECT_EQ(comm.sum_control(1.25 * comm.rank()), 3.75);
    EXPECT_EQ(comm.max_control(comm.rank() == 1 ? 7.0 : -1.0), 7.0);
    comm.barrier();
  });
}

// HSDP's reduction, written out plainly: element i of local range l, summed over the world.
// With 1 < T < N each node's T values are added in local rank order in fp32 and rounded to
// the dtype, then the P node values added in node order, divided by N for avg, rounded
// once; otherwise the flat rank order.
template <typename T>
T node_reduce_reference(int nodes, int per_node, size_t i, ReduceOp op) {
  const int world = nodes * per_node;
  if (per_node == 1 || nodes == 1) return reference_reduce<T>(world, i, op);
  float total = 0;
  for (int q = 0; q < nodes; ++q) {
    float partial = 0;
    for (int l = 0; l < per_node; ++l)
      partial += widen(from_float<T>(input_value(q * per_node + l, i)));
    total += widen(from_float<T>(partial));
  }
  if (op == ReduceOp::kAvg) total /= static_cast<float>(world);
  return from_float<T>(total);
}

TYPED_TEST(CollectiveTest, NodeReduceScatterReducesTheWorldIntoTheNodesRanges) {
  using T = TypeParam;
  const size_t w = sizeof(T);
  for (const auto& [nodes, per_node] : {std::pair{2, 2}, {2, 3}, {3, 2}, {1, 4}, {4, 1}, {3, 1}}) {
    const int world = nodes * per_node;
    CommOptions options = kOptions;
    options.node_ranks = per_node;
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        for (bool in_place : {false, true}) {
          run_local(world, options, [&](Communicator& comm) {
            const Partition part(count, per_node);
            const int r = comm.rank();
            const int l = r % per_node;
            std::vector<T> in = make_input<T>(r, count);
            std::vector<T> separate(part.count(l));
            std::span<T> out = in_place ? std::span<T>(in).subspan(part.offset(l), part.count(l))
                                        : std::span<T>(separate);
            comm.node_reduce_scatter_async(std::span<const T>(in), out, part, op).wait();
            for (size_t k = 0; k < out.size(); ++k) {
              const T want = node_reduce_reference<T>(nodes, per_node, part.offset(l) + k, op);
              ASSERT_TRUE(same_bits(out[k], want))
                  << nodes << " x " << per_node << " rank " << r << " count " << count << " "
                  << reduce_op_name(op) << (in_place ? " in place" : "") << " element " << k << ": "
                  << widen(out[k]) << " vs " << widen(want);
            }
            // The ledger: inside the node the peers' copies of range l; across nodes an
            // all-reduce of it split over the nodes.
            const uint64_t mine = part.count(l);
            const uint64_t piece = Partition(mine, nodes).count(r / per_node);
            const uint64_t cross = ((nodes - 1) * piece + mine - piece) * w;
            const CommCounter& c = comm.ledger().total(CommKind::kReduceScatter);
            EXPECT_EQ(c.bytes, (per_node - 1) * mine * w + cross);
            EXPECT_EQ(c.cross_node_bytes, cross);
          });
        }
      }
    }
  }
}

TEST(NodeReduceScatter, RefusesWhatItDoesNotDo) {
  CommOptions options = kOptions;
  options.node_ranks = 2;
  run_local(4, options, [&](Communicator& comm) {
    std::vector<float> in(10), out(5);
    const auto refused = [&](const Partition& part, ReduceOp op, std::span<float> o,
                             const std::string& expect) {
      try {
        comm.node_reduce_scatter_async(std::span<const float>(in), o, part, op).wait();
        ADD_FAILURE() << "accepted; wanted '" << expect << "'";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
      }
    };
    refused(Partition(10, 2), ReduceOp::kMax, out, "max is not supported");
    refused(Partition(10, 4), ReduceOp::kSum, out, "4 ranges but a node has 2 ranks");
    refused(Partition(10, 2), ReduceOp::kSum, std::span<float>(out).first(3), "owns 5 of 10");
  });
  options.qgz_bits = 4;
  run_local(4, options, [&](Communicator& comm) {
    std::vector<float> in(10), out(5);
    EXPECT_THROW(comm.node_reduce_scatter_async(std::span<const float>(in), std::span<float>(out),
                                                Partition(10, 2), ReduceOp::kSum),
                 InvalidArgument);
  });
}

// u8 buffers (quantized payloads) are moved, never reduced.
TEST(Collectives, MoveRawBytesButRefuseToReduceThem) {
  run_local(3, kOptions, [&](Communicator& comm) {
    const Partition part = Partition::from_counts(std::vector<size_t>{5, 0, 3});
    std::vector<std::byte> shard(part.count(comm.rank()),
                                 std::byte{static_cast<uint8_t>(comm.rank() + 1)});
    std::vector<std::byte> out(part.length());
    comm.all_gather(ConstBuffer(shard.data(), shard.size(), DType::kU8),
                    MutableBuffer(out.data(), out.size(), DType::kU8), part);
    EXPECT_EQ(out[0], std::byte{1});
    EXPECT_EQ(out[7], std::byte{3});
    EXPECT_EQ(comm.ledger().total(CommKind::kAllGather).bytes, 8 - shard.size());
    try {
      comm.all_reduce(MutableBuffer(out.data(), out.size(), DType::kU8), ReduceOp::kSum);
      ADD_FAILURE() << "a u8 all-reduce was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("u8 buffers hold raw bytes"), std::string::npos);
    }
  });
}

TEST(Collectives, RejectsMismatchedBuffersNamingSizesAndRank) {
  run_local(4, kOptions, [&](Communicator& comm) {
    const Partition part(51, 4);  // 13, 13, 13, 12
    std::vector<float> in(51), out(12);
    if (comm.rank() == 3) {
      std::vector<float> wrong(11);
      try {
        (void)comm.reduce_scatter_async(std::span<const float>(in), std::span<float>(wrong), part,
                                        ReduceOp::kSum);
        ADD_FAILURE() << "a wrong output size was accepted";
      } catch (const InvalidArgument& e) {
        EXPECT_STREQ(e.what(),
                     "reduce_scatter: output holds 11 elements, rank 3 owns 12 of 51 (world 4)");
      }
    }
    std::vector<BFloat16> other(51);
    EXPECT_THROW((void)comm.all_gather_async(std::span<const float>(in.data(), 51),
                                             std::span<BFloat16>(other), part),
                 InvalidArgument);
    EXPECT_THROW((void)comm.broadcast_async(std::span<float>(in), 4), InvalidArgument);
    // Aliasing a range that is not the own one is refused.
    EXPECT_THROW(
        (void)comm.reduce_scatter_async(std::span<const float>(in),
                                        std::span<float>(in.data() + 1, part.count(comm.rank())),
                                        part, ReduceOp::kSum),
        InvalidArgument);
    // Nothing was issued, so the ranks are still in step.
    comm.barrier();
  });
}

// sum_into, the fold world-size-invariant training builds on: M = 12 contributions, rank r
// giving contribution k * N + r at micro-step k, added to the owners' fp32 accumulators. For
// every world N dividing M, every range ends with the same bits: the accumulator's start
// plus contributions 0, 1, ..., 11, in that order, in fp32.
TYPED_TEST(CollectiveTest, SumIntoFoldsMicroStepsInOneOrderForEveryWorld) {
  using T = TypeParam;
  constexpr int kM = 12;
  constexpr size_t kCount = 101;
  std::vector<float> want(kCount);
  for (size_t j = 0; j < kCount; ++j) {
    float acc = input_value(kM + 5, j);
    for (int i = 0; i < kM; ++i) acc += widen(from_float<T>(input_value(i, j)));
    want[j] = acc;
  }
  for (int world : {1, 2, 3, 4, 6, 12}) {
    const Partition part(kCount, world);
    std::vector<float> got(kCount);
    std::mutex mu;
    run_local(world, kOptions, [&](Communicator& comm) {
      const int r = comm.rank();
      std::vector<float> acc(part.count(r));
      for (size_t j = 0; j < acc.size(); ++j) acc[j] = input_value(kM + 5, part.offset(r) + j);
      for (int k = 0; k < kM / world; ++k) {
        const std::vector<T> in = make_input<T>(k * world + r, kCount);
        comm.reduce_scatter(std::span<const T>(in), std::span<float>(acc), part,
                            ReduceOp::kSumInto);
      }
      std::lock_guard lock(mu);
      std::copy(acc.begin(), acc.end(), got.begin() + static_cast<std::ptrdiff_t>(part.offset(r)));
    });
    for (size_t j = 0; j < kCount; ++j) {
      ASSERT_TRUE(same_bits(got[j], want[j]))
          << "world " << world << " element " << j << ": " << got[j] << " vs " << want[j];
    }
  }
}

TEST(Collectives, SumIntoNeedsAnFp32AccumulatorOfItsOwn) {
  run_local(2, kOptions, [&](Communicator& comm) {
    const Partition part(10, 2);
    std::vector<BFloat16> in(10), acc16(5);
    std::vector<float> in32(10);
    try {
      (void)comm.reduce_scatter_async(std::span<const BFloat16>(in), std::span<BFloat16>(acc16),
                                      part, ReduceOp::kSumInto);
      ADD_FAILURE() << "a bf16 accumulator was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("fp32 accumulator"), std::string::npos) << e.what();
    }
    // The own range of an fp32 input is not an accumulator of its own.
    EXPECT_THROW(
        (void)comm.reduce_scatter_async(std::span<const float>(in32),
                                        std::span<float>(in32.data() + part.offset(comm.rank()), 5),
                                        part, ReduceOp::kSumInto),
        InvalidArgument);
    EXPECT_THROW((void)comm.all_reduce_async(std::span<float>(in32), ReduceOp::kSumInto),
                 InvalidArgument);
    comm.barrier();
  });
}

}  // namespace
}  // namespace zerodp::comm_test
