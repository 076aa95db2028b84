// The mpi backend's two-level collectives (CommOptions::two_level) and qgZ
// (CommOptions::qgz_bits) against the order each promises, computed here from every rank's
// input, and against the local backend. Part of comm_mpi_test (its main is in
// comm_mpi_test.cc); the suites' names contain "TwoLevel" for the six-rank run.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <gtest/gtest.h>

#include "comm/quantize.h"
#include "comm/reduce.h"
#include "comm_mpi_testing.h"

namespace zerodp::mpi_test {
namespace {

// ---------------------------------------------------------------------------------------
// Two-level collectives (CommOptions::two_level). The reference is the order the option
// promises, computed in this process from every rank's input: for each node, its ranks'
// inputs folded in local rank order and rounded; then the node partials folded in node order.

// Every rank's input, rank order: rank r's is make_input(dtype, seed + r, count).
std::vector<Bytes> all_inputs(DType dtype, int n, size_t count, int seed = 0) {
  std::vector<Bytes> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(make_input(dtype, seed + r, count));
  return inputs;
}

// What `rank` must hold after a two-level reduce-scatter of `inputs` with `node_ranks` ranks per
// node. kSumInto folds onto `acc`, this rank's fp32 accumulator.
Bytes two_level_reference(const std::vector<Bytes>& inputs, DType dtype, ReduceOp op,
                          const Partition& part, int node_ranks, int rank, Bytes acc = {}) {
  const int n = part.world_size();
  const int nodes = n / node_ranks;
  const size_t w = dtype_size(dtype);
  const size_t count = part.count(rank);
  const size_t first = part.offset(rank);
  std::vector<Bytes> partials(static_cast<size_t>(nodes), Bytes(count * w));
  std::vector<const void*> partial_ptrs;
  for (int q = 0; q < nodes; ++q) {
    std::vector<const void*> node_inputs;
    for (int l = 0; l < node_ranks; ++l) {
      node_inputs.push_back(inputs[static_cast<size_t>(q * node_ranks + l)].data() + first * w);
    }
    Bytes& partial = partials[static_cast<size_t>(q)];
    reduce_rank_order(node_inputs, partial.data(), count, dtype, node_partial_op(op));
    partial_ptrs.push_back(partial.data());
  }
  Bytes out = op == ReduceOp::kSumInto ? std::move(acc) : Bytes(count * w);
  reduce_rank_order(partial_ptrs, out.data(), count, dtype, op, n);
  return out;
}

// The flat rank-order reduction of `inputs` over `rank`'s range.
Bytes flat_reference(const std::vector<Bytes>& inputs, DType dtype, ReduceOp op,
                     const Partition& part, int rank) {
  const size_t w = dtype_size(dtype);
  std::vector<const void*> ptrs;
  for (const Bytes& in : inputs) ptrs.push_back(in.data() + part.offset(rank) * w);
  Bytes out(part.count(rank) * w);
  reduce_rank_order(ptrs, out.data(), part.count(rank), dtype, op);
  return out;
}

class MpiTwoLevelTest : public testing::TestWithParam<ReduceParam> {};

TEST_P(MpiTwoLevelTest, ReduceScatterFoldsNodesThenNodePartials) {
  const auto [dtype, op] = GetParam();
  const int n = world();
  const int me = my_rank();
  if (two_level_node_sizes(n).empty()) GTEST_SKIP() << kNoTwoLevel;
  const size_t w = dtype_size(dtype);
  for (int t : two_level_node_sizes(n)) {
    for (const std::string chunk : {"16", "default"}) {
      auto comm = make_two_level(t, chunk);
      for (size_t count : two_level_counts(n)) {
        for (Layout layout : {Layout::kBalanced, Layout::kSkewed}) {
          const Partition part = make_partition(count, n, layout);
          const size_t mine = part.count(me);
          const std::string what = fmt::format(
              "{} {} T {} chunk {}", describe("two-level reduce_scatter", dtype, count, layout),
              reduce_op_name(op), t, chunk);
          if (op == ReduceOp::kSumInto) {
            // Two micro-steps onto one accumulator.
            Bytes acc = make_input(DType::kF32, n + 3, mine, part.offset(me));
            Bytes expected = acc;
            for (int k = 0; k < 2; ++k) {
              const auto inputs = all_inputs(dtype, n, count, k * n);
              expected = two_level_reference(inputs, dtype, op, part, t, me, expected);
              comm->reduce_scatter({inputs[static_cast<size_t>(me)].data(), count, dtype},
                                   {acc.data(), mine, DType::kF32}, part, op);
            }
            EXPECT_SAME_BYTES(acc, expected, what);
            continue;
          }
          const auto inputs = all_inputs(dtype, n, count);
          const Bytes expected = two_level_reference(inputs, dtype, op, part, t, me);
          Bytes out(mine * w, std::byte{0xAB});
          comm->reduce_scatter({inputs[static_cast<size_t>(me)].data(), count, dtype},
                               {out.data(), mine, dtype}, part, op);
          EXPECT_SAME_BYTES(out, expected, what + " out of place");
          Bytes in_place = inputs[static_cast<size_t>(me)];
          std::byte* own = in_place.data() + part.offset(me) * w;
          comm->reduce_scatter({in_place.data(), count, dtype}, {own, mine, dtype}, part, op);
          EXPECT_SAME_BYTES(Bytes(own, own + mine * w), expected, what + " in place");
        }
      }
    }
  }
}

TEST_P(MpiTwoLevelTest, AllReduceIsTwoLevelReduceScatterThenAllGather) {
  const auto [dtype, op] = GetParam();
  if (op == ReduceOp::kSumInto) GTEST_SKIP() << "all_reduce takes sum, avg and max";
  const int n = world();
  const int me = my_rank();
  if (two_level_node_sizes(n).empty()) GTEST_SKIP() << kNoTwoLevel;
  const size_t w = dtype_size(dtype);
  for (int t : two_level_node_sizes(n)) {
    for (const std::string chunk : {"16", "default"}) {
      auto comm = make_two_level(t, chunk);
      for (size_t count : two_level_counts(n)) {
        const Partition part(count, n);
        const auto inputs = all_inputs(dtype, n, count);
        Bytes expected;
        for (int r = 0; r < n; ++r) {
          const Bytes range = two_level_reference(inputs, dtype, op, part, t, r);
          expected.insert(expected.end(), range.begin(), range.end());
        }
        Bytes all_reduced = inputs[static_cast<size_t>(me)];
        comm->all_reduce({all_reduced.data(), count, dtype}, op);
        Bytes shard(part.count(me) * w);
        Bytes gathered(count * w, std::byte{0xAB});
        comm->reduce_scatter({inputs[static_cast<size_t>(me)].data(), count, dtype},
                             {shard.data(), part.count(me), dtype}, part, op);
        comm->all_gather({shard.data(), part.count(me), dtype}, {gathered.data(), count, dtype},
                         part);
        const std::string what =
            fmt::format("{} {} T {} chunk {}",
                        describe("two-level all_reduce", dtype, count, Layout::kBalanced),
                        reduce_op_name(op), t, chunk);
        EXPECT_SAME_BYTES(all_reduced, expected, what);
        EXPECT_SAME_BYTES(gathered, all_reduced, what + " vs reduce_scatter + all_gather");
      }
    }
  }
}

// The local backend's two-level collectives give the same bytes as the mpi backend's.
TEST_P(MpiTwoLevelTest, MatchesLocalBackend) {
  const auto [dtype, op] = GetParam();
  const int n = world();
  if (two_level_node_sizes(n).empty()) GTEST_SKIP() << kNoTwoLevel;
  auto body = [dtype = dtype, op = op](Communicator& c) {
    std::vector<Bytes> outputs;
    const size_t w = dtype_size(dtype);
    for (size_t count : two_level_counts(c.size())) {
      for (Layout layout : {Layout::kBalanced, Layout::kSkewed}) {
        const Partition part = make_partition(count, c.size(), layout);
        const size_t mine = part.count(c.rank());
        const Bytes in = make_input(dtype, c.rank(), count);
        if (op == ReduceOp::kSumInto) {
          Bytes acc = make_input(DType::kF32, c.size() + 3, mine, part.offset(c.rank()));
          c.reduce_scatter({in.data(), count, dtype}, {acc.data(), mine, DType::kF32}, part, op);
          outputs.push_back(std::move(acc));
          continue;
        }
        Bytes out(mine * w);
        c.reduce_scatter({in.data(), count, dtype}, {out.data(), mine, dtype}, part, op);
        outputs.push_back(out);
        Bytes gathered(count * w);
        c.all_gather({out.data(), mine, dtype}, {gathered.data(), count, dtype}, part);
        outputs.push_back(std::move(gathered));
        if (layout == Layout::kBalanced) {
          Bytes buf = in;
          c.all_reduce({buf.data(), count, dtype}, op);
          outputs.push_back(std::move(buf));
        }
      }
    }
    return outputs;
  };
  for (int t : two_level_node_sizes(n)) {
    CommOptions options = kOptions;
    options.node_ranks = t;
    options.two_level = true;
    const auto expected = local_reference(body, options);
    auto comm = make_two_level(t, "16");
    const auto actual = body(*comm);
    ASSERT_EQ(actual.size(), expected.size());
    for (size_t i = 0; i < actual.size(); ++i) {
      EXPECT_SAME_BYTES(actual[i], expected[i],
                        fmt::format("two-level {} {} T {} world {} output {}", dtype_name(dtype),
                                    reduce_op_name(op), t, n, i));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllDtypesAndOps, MpiTwoLevelTest,
    testing::Values(
        ReduceParam{DType::kF32, ReduceOp::kSum}, ReduceParam{DType::kF32, ReduceOp::kAvg},
        ReduceParam{DType::kF32, ReduceOp::kMax}, ReduceParam{DType::kF32, ReduceOp::kSumInto},
        ReduceParam{DType::kF16, ReduceOp::kSum}, ReduceParam{DType::kF16, ReduceOp::kAvg},
        ReduceParam{DType::kF16, ReduceOp::kMax}, ReduceParam{DType::kF16, ReduceOp::kSumInto},
        ReduceParam{DType::kBF16, ReduceOp::kSum}, ReduceParam{DType::kBF16, ReduceOp::kAvg},
        ReduceParam{DType::kBF16, ReduceOp::kMax}, ReduceParam{DType::kBF16, ReduceOp::kSumInto}),
    reduce_param_name);

// Inputs whose fp32 sum depends on the grouping: 1e8 on rank 0, -1e8 on the first rank of
// node 1, 1 everywhere else. 1e8 + 1 rounds back to 1e8, so the flat fold loses the ones of
// node 0 and keeps the later ones, and the two-level fold loses those of nodes 0 and 1. A
// backend that ran flat when asked for two-level would fail here.
TEST(MpiTwoLevelOrderTest, DiffersFromTheFlatOrder) {
  const int n = world();
  const int me = my_rank();
  if (two_level_node_sizes(n).empty()) GTEST_SKIP() << kNoTwoLevel;
  const size_t count = static_cast<size_t>(3 * n);
  const Partition part(count, n);
  for (int t : two_level_node_sizes(n)) {
    std::vector<Bytes> inputs;
    for (int r = 0; r < n; ++r) {
      const float x = r == 0 ? 1e8f : r == t ? -1e8f : 1.0f;
      Bytes in(count * sizeof(float));
      for (size_t i = 0; i < count; ++i) std::memcpy(in.data() + i * sizeof(float), &x, 4);
      inputs.push_back(std::move(in));
    }
    const Bytes two_level = two_level_reference(inputs, DType::kF32, ReduceOp::kSum, part, t, me);
    const Bytes flat = flat_reference(inputs, DType::kF32, ReduceOp::kSum, part, me);
    ASSERT_NE(first_difference(two_level, flat), -1) << "the inputs do not tell the orders apart";
    for (bool on : {true, false}) {
      auto comm = make_two_level(t, "default", on);
      Bytes out(part.count(me) * sizeof(float));
      comm->reduce_scatter({inputs[static_cast<size_t>(me)].data(), count, DType::kF32},
                           {out.data(), part.count(me), DType::kF32}, part, ReduceOp::kSum);
      EXPECT_SAME_BYTES(out, on ? two_level : flat,
                        fmt::format("reduce_scatter T {} two_level {} world {}", t, on, n));
      Bytes buf = inputs[static_cast<size_t>(me)];
      comm->all_reduce({buf.data(), count, DType::kF32}, ReduceOp::kSum);
      const std::byte* own = buf.data() + part.offset(me) * sizeof(float);
      EXPECT_SAME_BYTES(Bytes(own, own + part.count(me) * sizeof(float)), on ? two_level : flat,
                        fmt::format("all_reduce T {} two_level {} world {}", t, on, n));
    }
  }
}

// With one node, or one rank per node, two-level is the flat order: the same bits as the flat
// rank-order fold, at every world size.
TEST(MpiTwoLevelOrderTest, OneNodeOrOneRankPerNodeIsFlat) {
  const int n = world();
  const int me = my_rank();
  for (int t : {0, 1, n}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      auto comm = make_two_level(t, "16");
      for (size_t count : two_level_counts(n)) {
        const Partition part = make_partition(count, n, Layout::kSkewed);
        const auto inputs = all_inputs(dtype, n, count);
        const Bytes expected = flat_reference(inputs, dtype, ReduceOp::kAvg, part, me);
        Bytes out(part.count(me) * dtype_size(dtype));
        comm->reduce_scatter({inputs[static_cast<size_t>(me)].data(), count, dtype},
                             {out.data(), part.count(me), dtype}, part, ReduceOp::kAvg);
        EXPECT_SAME_BYTES(
            out, expected,
            fmt::format("{} node_ranks {}",
                        describe("two-level reduce_scatter avg", dtype, count, Layout::kSkewed),
                        t));
      }
    }
  }
}

// Each rank's ledger records what the two-level algorithm makes it receive: with
// S_l = the elements owned by the ranks of its local index l, a reduce-scatter brings
// (T-1) * S_l * w from its node and (P-1) * c_r * w from the other nodes; an all-gather
// (S_l - c_r) * w from the other nodes and (C - S_l) * w from its node.
TEST(MpiTwoLevelLedgerTest, BytesFollowTheTwoLevelFormulas) {
  const int n = world();
  const int me = my_rank();
  if (two_level_node_sizes(n).empty()) GTEST_SKIP() << kNoTwoLevel;
  const size_t count = 1001;
  const DType dtype = DType::kBF16;
  const uint64_t w = dtype_size(dtype);
  for (int t : two_level_node_sizes(n)) {
    const int nodes = n / t;
    const int local = me % t;
    // Elements owned by the ranks of local index `local`.
    auto same_local = [&](const Partition& part) {
      uint64_t s = 0;
      for (int q = 0; q < nodes; ++q) s += part.count(q * t + local);
      return s;
    };
    auto comm = make_two_level(t, "default");
    const Partition skewed = make_partition(count, n, Layout::kSkewed);
    const Partition balanced(count, n);
    Bytes in = make_input(dtype, me, count);
    Bytes shard(skewed.count(me) * w);
    const uint64_t c = skewed.count(me);
    const uint64_t s = same_local(skewed);

    comm->reduce_scatter({in.data(), count, dtype}, {shard.data(), c, dtype}, skewed,
                         ReduceOp::kSum);
    const uint64_t rs_cross = static_cast<uint64_t>(nodes - 1) * c * w;
    EXPECT_EQ(comm->ledger().total(CommKind::kReduceScatter),
              (CommCounter{1, static_cast<uint64_t>(t - 1) * s * w + rs_cross, rs_cross}))
        << "T " << t << " rank " << me;

    comm->all_gather({shard.data(), c, dtype}, {in.data(), count, dtype}, skewed);
    EXPECT_EQ(comm->ledger().total(CommKind::kAllGather),
              (CommCounter{1, (count - c) * w, (s - c) * w}))
        << "T " << t << " rank " << me;

    comm->all_reduce({in.data(), count, dtype}, ReduceOp::kAvg);
    const uint64_t cb = balanced.count(me);
    const uint64_t sb = same_local(balanced);
    const uint64_t ar_cross = (static_cast<uint64_t>(nodes - 1) * cb + (sb - cb)) * w;
    EXPECT_EQ(comm->ledger().total(CommKind::kAllReduce),
              (CommCounter{1,
                           (static_cast<uint64_t>(t - 1) * sb +
                            static_cast<uint64_t>(nodes - 1) * cb + (count - cb)) *
                               w,
                           ar_cross}))
        << "T " << t << " rank " << me;
  }
}

// ---------------------------------------------------------------------------------------
// qgZ (CommOptions::qgz_bits): quantized reduce-scatters, in two levels over nodes of T ranks
// whatever two_level says. The suites' names contain "TwoLevel" so that the six-rank run,
// the first with two node sizes, runs them too.

// Every node size T that divides this world, 1 and N included (qgZ's T = 1 has only the
// cross-node level, T = N only the node level).
std::vector<int> all_node_sizes(int n) {
  std::vector<int> sizes;
  for (int t = 1; t <= n; ++t) {
    if (n % t == 0) sizes.push_back(t);
  }
  return sizes;
}

std::vector<BlockQuant> qgz_quants() {
  std::vector<BlockQuant> quants;
  for (QuantBits bits : {QuantBits::kInt8, QuantBits::kInt4}) {
    for (size_t block : {size_t{1}, size_t{7}, size_t{64}}) quants.push_back({bits, block});
  }
  return quants;
}

std::string describe(BlockQuant q) {
  return fmt::format("int{} blocks of {}", static_cast<int>(q.bits), q.block);
}

// A qgZ communicator: `quant`, `node_ranks` ranks per node, messages of at most `chunk` bytes.
std::unique_ptr<Communicator> make_qgz(int node_ranks, BlockQuant quant, const std::string& chunk,
                                       bool two_level) {
  CommOptions options = kOptions;
  options.node_ranks = node_ranks;
  options.two_level = two_level;
  options.qgz_bits = static_cast<int>(quant.bits);
  options.qgz_block = quant.block;
  if (chunk != "default") {
    EXPECT_EQ(setenv(kChunkEnv, chunk.c_str(), 1), 0);
  }
  auto comm = make_mpi(options);
  EXPECT_EQ(unsetenv(kChunkEnv), 0);
  return comm;
}

// `x` (`count` elements of `dtype`) widened to fp32.
std::vector<float> widen(const std::byte* x, size_t count, DType dtype) {
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(&out[i], x + 4 * i, 4);
    } else {
      uint16_t bits = 0;
      std::memcpy(&bits, x + 2 * i, 2);
      out[i] = dtype == DType::kF16 ? to_f32(Float16{bits}) : to_f32(BFloat16{bits});
    }
  }
  return out;
}

// What a receiver makes of `x` (`count` elements): quantized on its own, dequantized to fp32.
std::vector<float> roundtrip(ConstBuffer x, BlockQuant quant) {
  Bytes packed(quantized_bytes(x.count, quant));
  quantize(x, packed, quant);
  std::vector<float> back(x.count);
  dequantize(packed, std::span<float>(back), quant);
  return back;
}

// What `rank` must hold after a qgZ reduce-scatter of `inputs` (rank order), computed from
// CommOptions::qgz_bits's description with dequantize() and plain fp32 additions: node q's
// partial of the range folds, in local rank order from 0, the input of local index
// rank % T exact and the others' round trips; the total folds, in node order from 0 (from
// `acc` for sum_into), the partial of node rank / T exact and the others' round trips; then
// avg divides by N and sum and avg round once to the dtype.
Bytes qgz_reference(const std::vector<Bytes>& inputs, DType dtype, ReduceOp op,
                    const Partition& part, int node_ranks, BlockQuant quant, int rank,
                    const Bytes& acc = {}) {
  const int n = part.world_size();
  const int t = node_ranks == 0 ? n : node_ranks;
  const size_t count = part.count(rank);
  const size_t first = part.offset(rank);
  const size_t w = dtype_size(dtype);
  std::vector<float> total(count, 0.0f);
  if (op == ReduceOp::kSumInto && count > 0) std::memcpy(total.data(), acc.data(), count * 4);
  for (int q = 0; q < n / t; ++q) {
    std::vector<float> partial(count, 0.0f);
    for (int l = 0; l < t; ++l) {
      const std::byte* x = inputs[static_cast<size_t>(q * t + l)].data() + first * w;
      const std::vector<float> y =
          l == rank % t ? widen(x, count, dtype) : roundtrip({x, count, dtype}, quant);
      for (size_t i = 0; i < count; ++i) partial[i] += y[i];
    }
    const std::vector<float> y =
        q == rank / t ? partial : roundtrip(std::span<const float>(partial), quant);
    for (size_t i = 0; i < count; ++i) total[i] += y[i];
  }
  if (op == ReduceOp::kAvg) {
    for (float& v : total) v /= static_cast<float>(n);
  }
  const DType out_dtype = op == ReduceOp::kSumInto ? DType::kF32 : dtype;
  Bytes out(count * dtype_size(out_dtype));
  for (size_t i = 0; i < count; ++i) {
    if (out_dtype == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &total[i], 4);
    } else {
      const uint16_t bits =
          out_dtype == DType::kF16 ? to_f16(total[i]).bits : to_bf16(total[i]).bits;
      std::memcpy(out.data() + 2 * i, &bits, 2);
    }
  }
  return out;
}

class MpiQgzTwoLevelTest : public testing::TestWithParam<ReduceParam> {};

// Every node size, bit width and block size in the default chunks, and blocks of 7 in tiny
// ones too (every message split mid-block); ragged ranges and empty ones; into a separate buffer
// and in place, or two micro-steps onto an fp32 accumulator.
TEST_P(MpiQgzTwoLevelTest, ReduceScatterFoldsQuantizedPeersThenQuantizedNodePartials) {
  const auto [dtype, op] = GetParam();
  const int n = world();
  const int me = my_rank();
  const size_t w = dtype_size(dtype);
  for (int t : all_node_sizes(n)) {
    for (const BlockQuant quant : qgz_quants()) {
      for (const std::string chunk : {"12", "default"}) {
        // Tiny chunks split messages mid-block with one block size; thousands of 12-byte
        // messages per call make them too slow to try every size under an oversubscribed
        // mpirun.
        if (chunk == "12" && quant.block != 7) continue;
        // qgZ ignores two_level: try both.
        auto comm = make_qgz(t, quant, chunk, chunk == "default");
        for (size_t count : {size_t{1}, static_cast<size_t>(n - 1), static_cast<size_t>(7 * n + 3),
                             size_t{1000}}) {
          for (Layout layout : {Layout::kBalanced, Layout::kSkewed}) {
            const Partition part = make_partition(count, n, layout);
            const size_t mine = part.count(me);
            const std::string what = fmt::format(
                "{} {} T {} {} chunk {}", describe("qgZ reduce_scatter", dtype, count, layout),
                reduce_op_name(op), t, describe(quant), chunk);
            if (op == ReduceOp::kSumInto) {
              Bytes acc = make_input(DType::kF32, n + 3, mine, part.offset(me));
              Bytes expected = acc;
              for (int k = 0; k < 2; ++k) {
                const auto inputs = all_inputs(dtype, n, count, k * n);
                expected = qgz_reference(inputs, dtype, op, part, t, quant, me, expected);
                comm->reduce_scatter({inputs[static_cast<size_t>(me)].data(), count, dtype},
                                     {acc.data(), mine, DType::kF32}, part, op);
              }
              EXPECT_SAME_BYTES(acc, expected, what);
              continue;
            }
            const auto inputs = all_inputs(dtype, n, count);
            const Bytes expected = qgz_reference(inputs, dtype, op, part, t, quant, me);
            Bytes out(mine * w, std::byte{0xAB});
            comm->reduce_scatter({inputs[static_cast<size_t>(me)].data(), count, dtype},
                                 {out.data(), mine, dtype}, part, op);
            EXPECT_SAME_BYTES(out, expected, what + " out of place");
            Bytes in_place = inputs[static_cast<size_t>(me)];
            std::byte* own = in_place.data() + part.offset(me) * w;
            comm->reduce_scatter({in_place.data(), count, dtype}, {own, mine, dtype}, part, op);
            EXPECT_SAME_BYTES(Bytes(own, own + mine * w), expected, what + " in place");
          }
        }
      }
    }
  }
}

// The local backend's qgZ, which computes each rank's result from every input directly,
// gives the bytes the mpi backend's exchange does: reduce-scatters and the all-reduces
// built on them.
TEST_P(MpiQgzTwoLevelTest, MatchesLocalBackend) {
  const auto [dtype, op] = GetParam();
  auto body = [dtype = dtype, op = op](Communicator& c) {
    std::vector<Bytes> outputs;
    const size_t w = dtype_size(dtype);
    for (size_t count : two_level_counts(c.size())) {
      for (Layout layout : {Layout::kBalanced, Layout::kSkewed}) {
        const Partition part = make_partition(count, c.size(), layout);
        const size_t mine = part.count(c.rank());
        const Bytes in = make_input(dtype, c.rank(), count);
        if (op == ReduceOp::kSumInto) {
          Bytes acc = make_input(DType::kF32, c.size() + 3, mine, part.offset(c.rank()));
          c.reduce_scatter({in.data(), count, dtype}, {acc.data(), mine, DType::kF32}, part, op);
          outputs.push_back(std::move(acc));
          continue;
        }
        Bytes out(mine * w);
        c.reduce_scatter({in.data(), count, dtype}, {out.data(), mine, dtype}, part, op);
        outputs.push_back(std::move(out));
        if (layout == Layout::kBalanced) {
          Bytes buf = in;
          c.all_reduce({buf.data(), count, dtype}, op);
          outputs.push_back(std::move(buf));
        }
      }
    }
    return outputs;
  };
  const int n = world();
  for (int t : all_node_sizes(n)) {
    for (const BlockQuant quant :
         {BlockQuant{QuantBits::kInt8, 7}, BlockQuant{QuantBits::kInt4, 64}}) {
      CommOptions options = kOptions;
      options.node_ranks = t;
      options.qgz_bits = static_cast<int>(quant.bits);
      options.qgz_block = quant.block;
      const auto expected = local_reference(body, options);
      auto comm = make_qgz(t, quant, "16", false);
      const auto actual = body(*comm);
      ASSERT_EQ(actual.size(), expected.size());
      for (size_t i = 0; i < actual.size(); ++i) {
        EXPECT_SAME_BYTES(actual[i], expected[i],
                          fmt::format("qgZ {} {} T {} {} world {} output {}", dtype_name(dtype),
                                      reduce_op_name(op), t, describe(quant), n, i));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypesAndSums, MpiQgzTwoLevelTest,
                         testing::Values(ReduceParam{DType::kF32, ReduceOp::kSum},
                                         ReduceParam{DType::kF32, ReduceOp::kAvg},
                                         ReduceParam{DType::kF32, ReduceOp::kSumInto},
                                         ReduceParam{DType::kF16, ReduceOp::kSum},
                                         ReduceParam{DType::kF16, ReduceOp::kAvg},
                                         ReduceParam{DType::kF16, ReduceOp::kSumInto},
                                         ReduceParam{DType::kBF16, ReduceOp::kSum},
                                         ReduceParam{DType::kBF16, ReduceOp::kAvg},
                                         ReduceParam{DType::kBF16, ReduceOp::kSumInto}),
                         reduce_param_name);

// The packed size of `count` elements as comm/quantize.h lays it out: an fp32 scale per
// block, then a byte per int8 value or a nibble per int4 value.
uint64_t packed_size(size_t count, BlockQuant q) {
  const uint64_t scales = (count + q.block - 1) / q.block;
  const uint64_t values = q.bits == QuantBits::kInt8 ? count : (count + 1) / 2;
  return 4 * scales + values;
}

// Each rank's ledger records what qgZ makes it receive: every local peer's packets of the
// ranges of its local index l, (T - 1) * sum_q Q(c_(q, l)), and every other node's packet
// of its own range, (P - 1) * Q(c_r), the latter across nodes.
TEST(MpiQgzTwoLevelLedgerTest, BytesFollowTheQuantizedFormulas) {
  const int n = world();
  const int me = my_rank();
  const DType dtype = DType::kBF16;
  for (int t : all_node_sizes(n)) {
    for (const BlockQuant quant :
         {BlockQuant{QuantBits::kInt8, 7}, BlockQuant{QuantBits::kInt4, 64}}) {
      auto comm = make_qgz(t, quant, "default", true);
      CommCounter want{};
      for (size_t count : {size_t{1001}, static_cast<size_t>(7 * n + 3)}) {
        for (Layout layout : {Layout::kBalanced, Layout::kSkewed}) {
          const Partition part = make_partition(count, n, layout);
          const Bytes in = make_input(dtype, me, count);
          Bytes out(part.count(me) * dtype_size(dtype));
          comm->reduce_scatter({in.data(), count, dtype}, {out.data(), part.count(me), dtype}, part,
                               ReduceOp::kAvg);
          uint64_t column = 0;
          for (int q = 0; q < n / t; ++q) column += packed_size(part.count(q * t + me % t), quant);
          const uint64_t across =
              static_cast<uint64_t>(n / t - 1) * packed_size(part.count(me), quant);
          want.calls += 1;
          want.bytes += static_cast<uint64_t>(t - 1) * column + across;
          want.cross_node_bytes += across;
          EXPECT_EQ(comm->ledger().total(CommKind::kReduceScatter), want)
              << describe("qgZ reduce_scatter avg", dtype, count, layout) << " T " << t << " "
              << describe(quant) << " rank " << me;
        }
      }
    }
  }
}

}  // namespace
}  // namespace zerodp::mpi_test
