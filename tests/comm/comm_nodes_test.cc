// The local backend over nodes: two-level collectives, hpZ's node gather, qgZ's quantized
// reduce-scatter, and what the ledger counts for each, against plain references.
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include <fmt/core.h>

#include "comm/local.h"
#include "comm/quantize.h"
#include "comm_testing.h"
#include "core/error.h"

namespace zerodp::comm_test {
namespace {

// Bytes received from peers, per the ledger's formulas, for a ragged partition.
TEST(CommLedger, CountsExactlyTheBytesPeersSend) {
  const int world = 3;
  const size_t count = 10;  // ranges 4, 3, 3
  run_local(world, kOptions, [&](Communicator& comm) {
    CommPhaseScope train(comm.ledger(), CommPhase::kTrain);
    const Partition part(count, world);
    const size_t mine = part.count(comm.rank());
    std::vector<BFloat16> in(count), shard(mine), out(count);
    comm.reduce_scatter(std::span<const BFloat16>(in), std::span<BFloat16>(shard), part,
                        ReduceOp::kAvg);
    comm.all_gather(std::span<const BFloat16>(shard), std::span<BFloat16>(out), part);
    comm.all_reduce(std::span<BFloat16>(out), ReduceOp::kSum);
    std::vector<float> f(count);
    comm.broadcast(std::span<float>(f), 2);
    (void)comm.sum_control(1.0);

    const CommLedger& l = comm.ledger();
    const uint64_t w = 2;
    EXPECT_EQ(l.get(CommPhase::kTrain, CommKind::kReduceScatter),
              (CommCounter{1, (world - 1) * mine * w}));
    EXPECT_EQ(l.get(CommPhase::kTrain, CommKind::kAllGather), (CommCounter{1, (count - mine) * w}));
    EXPECT_EQ(l.get(CommPhase::kTrain, CommKind::kAllReduce),
              (CommCounter{1, ((world - 1) * mine + count - mine) * w}));
    EXPECT_EQ(l.get(CommPhase::kTrain, CommKind::kBroadcast),
              (CommCounter{1, comm.rank() == 2 ? 0 : count * 4}));
    EXPECT_EQ(l.get(CommPhase::kTrain, CommKind::kControl), (CommCounter{1, (world - 1) * 8u}));
    EXPECT_EQ(l.get(CommPhase::kOther, CommKind::kAllReduce), (CommCounter{}));
  });
}

// With T ranks per node, the bytes from peers on other nodes are counted apart: each
// collective's cross-node part equals the sum over those peers of what each sends, for
// P = 1..3 nodes of T = 1..3 ranks and ragged partitions (some shorter than the world).
TEST(CommLedger, CountsTheBytesThatCrossNodesApart) {
  for (int nodes : {1, 2, 3}) {
    for (int per_node : {1, 2, 3}) {
      const int world = nodes * per_node;
      for (size_t count : {size_t{1013}, size_t{5}}) {
        CommOptions options = kOptions;
        options.node_ranks = per_node;
        run_local(world, options, [&](Communicator& comm) {
          CommPhaseScope train(comm.ledger(), CommPhase::kTrain);
          const Partition part(count, world);
          const int r = comm.rank();
          const size_t mine = part.count(r);
          std::vector<BFloat16> in(count), shard(mine), out(count);
          comm.reduce_scatter(std::span<const BFloat16>(in), std::span<BFloat16>(shard), part,
                              ReduceOp::kAvg);
          comm.all_gather(std::span<const BFloat16>(shard), std::span<BFloat16>(out), part);
          comm.all_reduce(std::span<BFloat16>(out), ReduceOp::kSum);
          std::vector<float> f(count);
          comm.broadcast(std::span<float>(f), world - 1);
          (void)comm.sum_control(1.0);
          // What each peer on another node sends this rank.
          uint64_t rs = 0, ag = 0, control = 0;
          for (int p = 0; p < world; ++p) {
            if (p / per_node == r / per_node) continue;
            rs += mine * 2;
            ag += part.count(p) * 2;
            control += 8;
          }
          const bool root_away = (world - 1) / per_node != r / per_node;
          const CommLedger& l = comm.ledger();
          const auto cross = [&](CommKind k) {
            return l.get(CommPhase::kTrain, k).cross_node_bytes;
          };
          const std::string where = std::to_string(nodes) + " nodes x " + std::to_string(per_node) +
                                    " ranks, " + std::to_string(count) + " elements, rank " +
                                    std::to_string(r);
          EXPECT_EQ(cross(CommKind::kReduceScatter), rs) << where;
          EXPECT_EQ(cross(CommKind::kAllGather), ag) << where;
          EXPECT_EQ(cross(CommKind::kAllReduce), rs + ag) << where;
          EXPECT_EQ(cross(CommKind::kBroadcast), root_away ? count * 4 : 0) << where;
          EXPECT_EQ(cross(CommKind::kControl), control) << where;
        });
      }
    }
  }
}

// The two-level algorithms' bytes, counted message by message as CommOptions::two_level
// describes them: a reduce-scatter receives, from each peer of its node, that peer's copy of
// the ranges of every rank sharing its local index, and from each rank of its local index on
// another node, that node's partial of its own range; an all-gather receives, across nodes,
// the shards of its local index, then from each peer of its node the shards of that peer's
// local index.
TEST(CommLedger, TwoLevelCollectivesCountEachLevelMessageByMessage) {
  for (int nodes : {1, 2, 3}) {
    for (int per_node : {1, 2, 3}) {
      const int world = nodes * per_node;
      for (size_t count : {size_t{1013}, size_t{5}}) {
        CommOptions options = kOptions;
        options.node_ranks = per_node;
        options.two_level = true;
        run_local(world, options, [&](Communicator& comm) {
          CommPhaseScope train(comm.ledger(), CommPhase::kTrain);
          const Partition part(count, world);
          const int r = comm.rank();
          const int node = r / per_node;
          const int local = r % per_node;
          const size_t mine = part.count(r);
          std::vector<BFloat16> in(count), shard(mine), out(count);
          comm.reduce_scatter(std::span<const BFloat16>(in), std::span<BFloat16>(shard), part,
                              ReduceOp::kAvg);
          comm.all_gather(std::span<const BFloat16>(shard), std::span<BFloat16>(out), part);
          comm.all_reduce(std::span<BFloat16>(out), ReduceOp::kSum);
          const auto column = [&](int l) {
            size_t n = 0;
            for (int q = 0; q < nodes; ++q) n += part.count(q * per_node + l);
            return n;
          };
          uint64_t rs = 0, rs_cross = 0, ag = 0, ag_cross = 0;
          for (int l = 0; l < per_node; ++l) {
            if (l == local) continue;
            rs += column(local) * 2;
            ag += column(l) * 2;
          }
          for (int q = 0; q < nodes; ++q) {
            if (q == node) continue;
            rs_cross += mine * 2;
            ag_cross += part.count(q * per_node + local) * 2;
          }
          const Partition even(count, world);  // all_reduce's own partition
          ASSERT_EQ(even.count(r), part.count(r));
          const CommLedger& l = comm.ledger();
          const auto got = [&](CommKind k) { return l.get(CommPhase::kTrain, k); };
          const std::string where = std::to_string(nodes) + " nodes x " + std::to_string(per_node) +
                                    " ranks, " + std::to_string(count) + " elements, rank " +
                                    std::to_string(r);
          EXPECT_EQ(got(CommKind::kReduceScatter).bytes, rs + rs_cross) << where;
          EXPECT_EQ(got(CommKind::kReduceScatter).cross_node_bytes, rs_cross) << where;
          EXPECT_EQ(got(CommKind::kAllGather).bytes, ag + ag_cross) << where;
          EXPECT_EQ(got(CommKind::kAllGather).cross_node_bytes, ag_cross) << where;
          EXPECT_EQ(got(CommKind::kAllReduce).bytes, rs + rs_cross + ag + ag_cross) << where;
          EXPECT_EQ(got(CommKind::kAllReduce).cross_node_bytes, rs_cross + ag_cross) << where;
          // Whatever the algorithm, an all-gather brings every range but one's own.
          EXPECT_EQ(ag + ag_cross, (count - mine) * 2) << where;
        });
      }
    }
  }
}

// The two-level fold, computed here with plain float arithmetic: node partials rounded to
// the dtype, then folded in node order, divided by the world for avg, rounded once. With
// one node, or one rank per node, it is the flat fold.
template <typename T>
std::vector<T> two_level_reference(const std::vector<std::vector<T>>& inputs, int per_node,
                                   const Partition& part, int rank, ReduceOp op) {
  const int world = static_cast<int>(inputs.size());
  std::vector<T> out(part.count(rank));
  for (size_t i = 0; i < out.size(); ++i) {
    const size_t at = part.offset(rank) + i;
    float acc = 0;
    for (int q = 0; q < world / per_node; ++q) {
      float node = widen(inputs[q * per_node][at]);
      for (int l = 1; l < per_node; ++l) {
        const float x = widen(inputs[q * per_node + l][at]);
        node = op == ReduceOp::kMax ? std::max(node, x) : node + x;
      }
      // One node is the flat fold: nothing crosses nodes, so nothing is rounded between.
      const float partial = world == per_node ? node : widen(from_float<T>(node));
      acc = q == 0 ? partial : op == ReduceOp::kMax ? std::max(acc, partial) : acc + partial;
    }
    if (op == ReduceOp::kAvg) acc /= static_cast<float>(world);
    out[i] = from_float<T>(acc);
  }
  return out;
}

template <typename T>
void check_two_level_reduce_scatter(ReduceOp op) {
  for (const auto& [nodes, per_node] : {std::pair{2, 2}, {3, 2}, {2, 3}, {1, 3}, {3, 1}}) {
    const int world = nodes * per_node;
    for (size_t count : {size_t{1}, size_t{7}, size_t{20011}}) {
      std::vector<std::vector<T>> inputs(static_cast<size_t>(world), std::vector<T>(count));
      for (int r = 0; r < world; ++r) {
        for (size_t i = 0; i < count; ++i) inputs[r][i] = from_float<T>(input_value(r, i));
      }
      const Partition part(count, world);
      CommOptions options = kOptions;
      options.node_ranks = per_node;
      options.two_level = true;
      run_local(world, options, [&](Communicator& comm) {
        const int r = comm.rank();
        std::vector<T> out(part.count(r));
        comm.reduce_scatter(std::span<const T>(inputs[r]), std::span<T>(out), part, op);
        const std::vector<T> want = two_level_reference(inputs, per_node, part, r, op);
        for (size_t i = 0; i < out.size(); ++i) {
          ASSERT_EQ(std::memcmp(&out[i], &want[i], sizeof(T)), 0)
              << nodes << " x " << per_node << ", " << count << " elements, rank " << r
              << ", element " << i << ": " << widen(out[i]) << " vs " << widen(want[i]);
        }
      });
    }
  }
}

TEST(TwoLevel, ReduceScatterFoldsEachNodeThenTheNodesInOrder) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    check_two_level_reduce_scatter<float>(op);
    check_two_level_reduce_scatter<BFloat16>(op);
    check_two_level_reduce_scatter<Float16>(op);
  }
}

// The accumulating form adds the node partials, in node order, onto the fp32 accumulator.
TEST(TwoLevel, SumIntoAddsTheNodePartialsOntoTheAccumulator) {
  const int per_node = 2, world = 4;
  const size_t count = 1001;
  CommOptions options = kOptions;
  options.node_ranks = per_node;
  options.two_level = true;
  run_local(world, options, [&](Communicator& comm) {
    const Partition part(count, world);
    const int r = comm.rank();
    std::vector<BFloat16> in(count);
    for (size_t i = 0; i < count; ++i) in[i] = to_bf16(input_value(r, i));
    std::vector<float> acc(part.count(r), 0.5f);
    comm.reduce_scatter(std::span<const BFloat16>(in), std::span<float>(acc), part,
                        ReduceOp::kSumInto);
    for (size_t i = 0; i < acc.size(); ++i) {
      const size_t at = part.offset(r) + i;
      float want = 0.5f;
      for (int q = 0; q < 2; ++q) {
        const float node =
            widen(to_bf16(input_value(2 * q, at))) + widen(to_bf16(input_value(2 * q + 1, at)));
        want += widen(to_bf16(node));
      }
      ASSERT_EQ(acc[i], want) << "rank " << r << ", element " << i;
    }
  });
}

// Not the flat fold: a test that would catch a backend running flat under two_level.
// 1e8 + 1 rounds to 1e8 in fp32, so the flat fold ((1e8 + 1) - 1e8) + 1 is 1, while the
// nodes' partials 1e8 and -1e8 cancel to 0.
TEST(TwoLevel, IsNotTheFlatOrder) {
  const float x[4] = {1e8f, 1.0f, -1e8f, 1.0f};
  for (bool two_level : {false, true}) {
    CommOptions options = kOptions;
    options.node_ranks = 2;
    options.two_level = two_level;
    run_local(4, options, [&](Communicator& comm) {
      std::vector<float> buf(4, x[comm.rank()]);
      comm.all_reduce(std::span<float>(buf), ReduceOp::kSum);
      EXPECT_EQ(buf[0], two_level ? 0.0f : 1.0f) << (two_level ? "two-level" : "flat");
    });
  }
}

TEST(TwoLevel, AllGatherPlacesEveryShard) {
  CommOptions options = kOptions;
  options.node_ranks = 3;
  options.two_level = true;
  const size_t count = 1013;
  run_local(6, options, [&](Communicator& comm) {
    const Partition part(count, 6);
    const int r = comm.rank();
    std::vector<float> shard(part.count(r)), out(count, -1.0f);
    for (size_t i = 0; i < shard.size(); ++i) shard[i] = input_value(r, i);
    comm.all_gather(std::span<const float>(shard), std::span<float>(out), part);
    for (int k = 0; k < 6; ++k) {
      for (size_t i = 0; i < part.count(k); ++i) {
        ASSERT_EQ(out[part.offset(k) + i], input_value(k, i)) << "rank " << r << " of " << k;
      }
    }
  });
}

// hpZ's gather: each node gathers its own ranks' shards, and nothing crosses nodes.
TEST(NodeAllGather, GathersTheShardsOfThisNodeOnly) {
  for (const auto& [nodes, per_node] : {std::pair{2, 3}, {3, 2}, {1, 4}, {4, 1}}) {
    const int world = nodes * per_node;
    CommOptions options = kOptions;
    options.node_ranks = per_node;
    const size_t count = 1013;
    run_local(world, options, [&](Communicator& comm) {
      const Partition part(count, per_node);
      const int r = comm.rank();
      const int node = r / per_node;
      std::vector<BFloat16> shard(part.count(r % per_node)), out(count);
      for (size_t i = 0; i < shard.size(); ++i) shard[i] = to_bf16(input_value(r, i));
      comm.node_all_gather_async(std::span<const BFloat16>(shard), std::span<BFloat16>(out), part)
          .wait();
      for (int l = 0; l < per_node; ++l) {
        for (size_t i = 0; i < part.count(l); ++i) {
          ASSERT_EQ(widen(out[part.offset(l) + i]),
                    widen(to_bf16(input_value(node * per_node + l, i))))
              << nodes << " x " << per_node << ": rank " << r << ", local " << l << ", " << i;
        }
      }
      const CommCounter& c = comm.ledger().total(CommKind::kAllGather);
      EXPECT_EQ(c.bytes, (count - shard.size()) * 2);
      EXPECT_EQ(c.cross_node_bytes, 0u);
    });
  }
}

// qgZ, computed here from CommOptions::qgz_bits's description with dequantize() into fp32
// and plain additions: node partials of exact own and dequantized peer inputs, then the
// nodes' partials, the own node's exact, in node order.
std::vector<float> qgz_reference(const std::vector<std::vector<BFloat16>>& inputs, int per_node,
                                 const Partition& part, int rank, BlockQuant q, ReduceOp op,
                                 const std::vector<float>& start) {
  const int world = static_cast<int>(inputs.size());
  const size_t n = part.count(rank);
  const auto roundtrip = [&](ConstBuffer x) {
    std::vector<std::byte> packed(quantized_bytes(n, q));
    quantize(x, packed, q);
    std::vector<float> back(n);
    dequantize(packed, std::span<float>(back), q);
    return back;
  };
  std::vector<float> total = op == ReduceOp::kSumInto ? start : std::vector<float>(n, 0.0f);
  for (int p = 0; p < world / per_node; ++p) {
    std::vector<float> partial(n, 0.0f);
    for (int l = 0; l < per_node; ++l) {
      const BFloat16* x = inputs[p * per_node + l].data() + part.offset(rank);
      if (l == rank % per_node) {
        for (size_t i = 0; i < n; ++i) partial[i] += to_f32(x[i]);
      } else {
        const std::vector<float> y = roundtrip(ConstBuffer(x, n, DType::kBF16));
        for (size_t i = 0; i < n; ++i) partial[i] += y[i];
      }
    }
    const std::vector<float> y =
        p == rank / per_node ? partial : roundtrip(std::span<const float>(partial));
    for (size_t i = 0; i < n; ++i) total[i] += y[i];
  }
  if (op == ReduceOp::kAvg) {
    for (float& v : total) v /= static_cast<float>(world);
  }
  return total;
}

TEST(Qgz, ReduceScatterFoldsDequantizedPeersInsideThenAcrossNodes) {
  for (const auto& [nodes, per_node] : {std::pair{2, 2}, {3, 2}, {2, 3}, {1, 3}, {3, 1}}) {
    for (const BlockQuant q : {BlockQuant{QuantBits::kInt4, 64}, BlockQuant{QuantBits::kInt8, 7}}) {
      for (ReduceOp op : {ReduceOp::kAvg, ReduceOp::kSumInto}) {
        const int world = nodes * per_node;
        const size_t count = 1013;
        std::vector<std::vector<BFloat16>> inputs(static_cast<size_t>(world),
                                                  std::vector<BFloat16>(count));
        for (int r = 0; r < world; ++r) {
          for (size_t i = 0; i < count; ++i) inputs[r][i] = to_bf16(input_value(r, i));
        }
        const Partition part(count, world);
        CommOptions options = kOptions;
        options.node_ranks = per_node;
        options.qgz_bits = static_cast<int>(q.bits);
        options.qgz_block = q.block;
        run_local(world, options, [&](Communicator& comm) {
          const int r = comm.rank();
          const std::string where =
              fmt::format("{} x {}, int{} blocks of {}, {}, rank {}", nodes, per_node,
                          static_cast<int>(q.bits), q.block, reduce_op_name(op), r);
          const std::vector<float> start(part.count(r), 0.25f);
          std::vector<float> want = qgz_reference(inputs, per_node, part, r, q, op, start);
          if (op == ReduceOp::kSumInto) {
            std::vector<float> acc = start;
            comm.reduce_scatter(std::span<const BFloat16>(inputs[r]), std::span<float>(acc), part,
                                op);
            for (size_t i = 0; i < acc.size(); ++i) ASSERT_EQ(acc[i], want[i]) << where << " " << i;
          } else {
            std::vector<BFloat16> out(part.count(r));
            comm.reduce_scatter(std::span<const BFloat16>(inputs[r]), std::span<BFloat16>(out),
                                part, op);
            for (size_t i = 0; i < out.size(); ++i) {
              ASSERT_EQ(out[i].bits, to_bf16(want[i]).bits) << where << " " << i;
            }
          }
          // Bytes: each local peer's quantized copy of the ranges of this local index, and
          // each other node's quantized partial of the own range.
          uint64_t intra = 0;
          for (int p = 0; p < nodes; ++p) {
            intra += quantized_bytes(part.count(p * per_node + r % per_node), q);
          }
          intra *= static_cast<uint64_t>(per_node - 1);
          const uint64_t cross =
              static_cast<uint64_t>(nodes - 1) * quantized_bytes(part.count(r), q);
          const CommCounter& c = comm.ledger().total(CommKind::kReduceScatter);
          EXPECT_EQ(c.bytes, intra + cross) << where;
          EXPECT_EQ(c.cross_node_bytes, cross) << where;
        });
      }
    }
  }
}

TEST(Qgz, RefusesMax) {
  CommOptions options = kOptions;
  options.qgz_bits = 8;
  run_local(2, options, [&](Communicator& comm) {
    std::vector<float> in(4), out(2);
    EXPECT_THROW((void)comm.reduce_scatter_async(std::span<const float>(in), std::span<float>(out),
                                                 Partition(4, 2), ReduceOp::kMax),
                 InvalidArgument);
    EXPECT_THROW((void)comm.all_reduce_async(std::span<float>(in), ReduceOp::kMax),
                 InvalidArgument);
  });
}

// A world is whole nodes.
TEST(CommLedger, RefusesNodesThatDoNotDivideTheWorld) {
  CommOptions options = kOptions;
  options.node_ranks = 2;
  try {
    run_local(3, options, [](Communicator&) {});
    ADD_FAILURE() << "3 ranks in nodes of 2 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--node-ranks 2 does not divide the world of 3 ranks"),
              std::string::npos)
        << e.what();
  }
}

TEST(CommLedger, SumOverRanksOfReduceScatterIsTheRingVolume) {
  for (int world : {2, 3, 4, 5, 8}) {
    const size_t count = 1013;
    std::mutex mu;
    uint64_t total = 0;
    run_local(world, kOptions, [&](Communicator& comm) {
      const Partition part(count, world);
      std::vector<float> in(count), out(part.count(comm.rank()));
      comm.reduce_scatter(std::span<const float>(in), std::span<float>(out), part, ReduceOp::kSum);
      std::lock_guard lock(mu);
      total += comm.ledger().total(CommKind::kReduceScatter).bytes;
    });
    EXPECT_EQ(total, static_cast<uint64_t>(world - 1) * count * 4) << "world " << world;
  }
}

}  // namespace
}  // namespace zerodp::comm_test
