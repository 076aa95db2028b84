// The mpi backend against the local backend: for the same world size and inputs, every
// collective gives the same bytes. Each MPI process also runs a LocalWorld of N threads with
// the same test body and compares its own rank's output. Run under mpirun -np 2, 3, 4
// (ctest label `mpi`); the main below owns MPI and agrees on one exit code for all ranks.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <gtest/gtest.h>

#include "comm/local.h"
#include "comm/mpi.h"
#include "comm/quantize.h"
#include "comm/reduce.h"
#include "core/error.h"

namespace zerodp {

// Ledger mismatches print as numbers (found by argument-dependent lookup, so outside the
// unnamed namespace).
void PrintTo(const CommCounter& c, std::ostream* os) {
  *os << fmt::format("{{calls {}, bytes {}, cross-node bytes {}}}", c.calls, c.bytes,
                     c.cross_node_bytes);
}

namespace {

MpiSession* g_session = nullptr;  // set by main() for the life of the tests

const CommOptions kOptions{.timeout_seconds = 60};
constexpr size_t kCounts[] = {0, 1, 7, 13, 1000, 100003};
constexpr const char* kChunkEnv = "ZERODP_MPI_CHUNK_BYTES";

using Bytes = std::vector<std::byte>;

std::unique_ptr<Communicator> make_mpi(const CommOptions& options = kOptions) {
  return g_session->make_communicator(options);
}
int world() { return g_session->size(); }
int my_rank() { return g_session->rank(); }

// A value of rank `rank` at index `i`: magnitudes 2^-12..2^12, both signs, 21 mantissa bits,
// so fp32 sums depend on their order and 16-bit rounding matters.
float input_value(int rank, size_t i) {
  uint64_t h =
      (i + 1) * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(rank) + 7) * 0xBF58476D1CE4E5B9ull;
  h ^= h >> 31;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 29;
  const float mantissa = 1.0f + static_cast<float>(h & 0x1FFFFF) / static_cast<float>(1 << 21);
  const int exponent = static_cast<int>((h >> 21) % 25) - 12;
  const float sign = (h >> 40) & 1 ? -1.0f : 1.0f;
  return sign * std::ldexp(mantissa, exponent);
}

// `count` elements of `dtype` whose element i is input_value(rank, first + i), rounded.
Bytes make_input(DType dtype, int rank, size_t count, size_t first = 0) {
  Bytes out(count * dtype_size(dtype));
  for (size_t i = 0; i < count; ++i) {
    const float x = input_value(rank, first + i);
    if (dtype == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &x, 4);
    } else {
      const uint16_t bits = dtype == DType::kF16 ? to_f16(x).bits : to_bf16(x).bits;
      std::memcpy(out.data() + 2 * i, &bits, 2);
    }
  }
  return out;
}

// The index of the first differing byte, or -1 when `a` and `b` are equal.
long first_difference(const Bytes& a, const Bytes& b) {
  if (a.size() != b.size()) return static_cast<long>(std::min(a.size(), b.size()));
  const auto it = std::mismatch(a.begin(), a.end(), b.begin());
  return it.first == a.end() ? -1 : static_cast<long>(it.first - a.begin());
}

#define EXPECT_SAME_BYTES(actual, expected, what)                                            \
  do {                                                                                       \
    const long diff_ = first_difference(actual, expected);                                   \
    EXPECT_EQ(diff_, -1) << (what) << ": " << (actual).size() << " vs " << (expected).size() \
                         << " bytes, first difference at byte " << diff_;                    \
  } while (0)

enum class Layout { kBalanced, kSkewed };

// kBalanced: Partition(count, n). kSkewed: even ranks own nothing, odd ranks split the
// buffer 2:1 (the last odd rank takes the rest), so empty and ragged ranges both occur. A
// world of one rank has no skewed layout: it owns everything.
Partition make_partition(size_t count, int n, Layout layout) {
  if (layout == Layout::kBalanced || n == 1) return Partition(count, n);
  std::vector<size_t> counts(static_cast<size_t>(n), 0);
  size_t left = count;
  for (int r = 1; r < n; r += 2) {
    const bool last = r + 2 >= n;
    counts[static_cast<size_t>(r)] = last ? left : left * 2 / 3;
    left -= counts[static_cast<size_t>(r)];
  }
  return Partition::from_counts(counts);
}

std::string describe(std::string_view op, DType dtype, size_t count, Layout layout) {
  return fmt::format("{} {} count {} {} world {}", op, dtype_name(dtype), count,
                     layout == Layout::kBalanced ? "balanced" : "skewed", world());
}

// Runs `body` on a LocalWorld of world() threads and returns what rank my_rank() produced:
// the reference the mpi backend must match byte for byte.
template <typename Body>
auto local_reference(const Body& body, const CommOptions& options = kOptions) {
  std::vector<decltype(body(std::declval<Communicator&>()))> results(static_cast<size_t>(world()));
  run_local(world(), options,
            [&](Communicator& c) { results[static_cast<size_t>(c.rank())] = body(c); });
  return results[static_cast<size_t>(my_rank())];
}

// ---------------------------------------------------------------------------------------
// Reductions, parameterized by dtype and op: the same body under both backends.

struct ReduceParam {
  DType dtype;
  ReduceOp op;
};
void PrintTo(const ReduceParam& p, std::ostream* os) {
  *os << dtype_name(p.dtype) << " " << reduce_op_name(p.op);
}

class MpiReduceTest : public testing::TestWithParam<ReduceParam> {};

// Every count and layout: reduce-scatter into a separate buffer, then in place.
std::vector<Bytes> reduce_scatter_sweep(Communicator& c, DType dtype, ReduceOp op) {
  std::vector<Bytes> outputs;
  for (size_t count : kCounts) {
    for (Layout layout : {Layout::kBalanced, Layout::kSkewed}) {
      const Partition part = make_partition(count, c.size(), layout);
      const size_t w = dtype_size(dtype);
      const Bytes in = make_input(dtype, c.rank(), count);
      Bytes out(part.count(c.rank()) * w, std::byte{0xAB});
      c.reduce_scatter({in.data(), count, dtype}, {out.data(), out.size() / w, dtype}, part, op);
      outputs.push_back(out);
      Bytes in_place = in;
      std::byte* own = in_place.data() + part.offset(c.rank()) * w;
      c.reduce_scatter({in_place.data(), count, dtype}, {own, part.count(c.rank()), dtype}, part,
                       op);
      outputs.emplace_back(own, own + part.count(c.rank()) * w);
    }
  }
  return outputs;
}

std::vector<Bytes> all_reduce_sweep(Communicator& c, DType dtype, ReduceOp op) {
  std::vector<Bytes> outputs;
  for (size_t count : kCounts) {
    Bytes buf = make_input(dtype, c.rank(), count);
    c.all_reduce({buf.data(), count, dtype}, op);
    outputs.push_back(std::move(buf));
  }
  return outputs;
}

TEST_P(MpiReduceTest, ReduceScatterMatchesLocalBackend) {
  const auto [dtype, op] = GetParam();
  const auto expected =
      local_reference([&](Communicator& c) { return reduce_scatter_sweep(c, dtype, op); });
  auto comm = make_mpi();
  const auto actual = reduce_scatter_sweep(*comm, dtype, op);
  ASSERT_EQ(actual.size(), expected.size());
  size_t i = 0;
  for (size_t count : kCounts) {
    for (Layout layout : {Layout::kBalanced, Layout::kSkewed}) {
      for (const char* how : {"out of place", "in place"}) {
        EXPECT_SAME_BYTES(actual[i], expected[i],
                          fmt::format("{} {} {}", describe("reduce_scatter", dtype, count, layout),
                                      reduce_op_name(op), how));
        ++i;
      }
    }
  }
}

// sum_into: three micro-steps of every count and layout into fp32 accumulators, in the
// default chunks and in 4 KiB ones (rounds that cut 16-bit inputs and the fp32 accumulator at
// different byte offsets), byte for byte the local backend's.
std::vector<Bytes> sum_into_sweep(Communicator& c, DType dtype) {
  std::vector<Bytes> outputs;
  for (size_t count : kCounts) {
    for (Layout layout : {Layout::kBalanced, Layout::kSkewed}) {
      const Partition part = make_partition(count, c.size(), layout);
      const size_t mine = part.count(c.rank());
      Bytes acc = make_input(DType::kF32, c.size() + 3, mine, part.offset(c.rank()));
      for (int k = 0; k < 3; ++k) {
        const Bytes in = make_input(dtype, k * c.size() + c.rank(), count);
        c.reduce_scatter({in.data(), count, dtype}, {acc.data(), mine, DType::kF32}, part,
                         ReduceOp::kSumInto);
      }
      outputs.push_back(acc);
    }
  }
  return outputs;
}

TEST(MpiSumIntoTest, MatchesLocalBackendInAnyChunkSize) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const auto expected =
        local_reference([&](Communicator& c) { return sum_into_sweep(c, dtype); });
    for (const char* chunk : {"4096", "default"}) {
      if (std::string(chunk) == "4096") {
        ASSERT_EQ(setenv(kChunkEnv, chunk, 1), 0);
      }
      auto comm = make_mpi();
      ASSERT_EQ(unsetenv(kChunkEnv), 0);
      const auto actual = sum_into_sweep(*comm, dtype);
      ASSERT_EQ(actual.size(), expected.size());
      for (size_t i = 0; i < actual.size(); ++i) {
        EXPECT_SAME_BYTES(actual[i], expected[i],
                          fmt::format("sum_into {} sweep entry {} chunk {} world {}",
                                      dtype_name(dtype), i, chunk, world()));
      }
    }
  }
}

TEST_P(MpiReduceTest, AllReduceMatchesLocalBackend) {
  const auto [dtype, op] = GetParam();
  const auto expected =
      local_reference([&](Communicator& c) { return all_reduce_sweep(c, dtype, op); });
  auto comm = make_mpi();
  const auto actual = all_reduce_sweep(*comm, dtype, op);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < std::size(kCounts); ++i) {
    EXPECT_SAME_BYTES(
        actual[i], expected[i],
        fmt::format("{} {}", describe("all_reduce", dtype, kCounts[i], Layout::kBalanced),
                    reduce_op_name(op)));
  }
}

TEST_P(MpiReduceTest, AllReduceEqualsReduceScatterThenAllGather) {
  const auto [dtype, op] = GetParam();
  auto comm = make_mpi();
  const size_t w = dtype_size(dtype);
  for (size_t count : kCounts) {
    const Partition part(count, comm->size());
    const Bytes in = make_input(dtype, comm->rank(), count);
    Bytes all_reduced = in;
    comm->all_reduce({all_reduced.data(), count, dtype}, op);
    Bytes shard(part.count(comm->rank()) * w);
    Bytes gathered(count * w);
    comm->reduce_scatter({in.data(), count, dtype}, {shard.data(), shard.size() / w, dtype}, part,
                         op);
    comm->all_gather({shard.data(), shard.size() / w, dtype}, {gathered.data(), count, dtype},
                     part);
    EXPECT_SAME_BYTES(all_reduced, gathered,
                      fmt::format("{} {}", describe("all_reduce", dtype, count, Layout::kBalanced),
                                  reduce_op_name(op)));
  }
}

// Messages split into tiny pieces (reduce-scatter rounds of a few elements, all-gather and
// broadcast pieces that cut elements in two) give the same bytes as the default.
TEST_P(MpiReduceTest, TinyChunksMatchLocalBackend) {
  const auto [dtype, op] = GetParam();
  const auto expected_rs =
      local_reference([&](Communicator& c) { return reduce_scatter_sweep(c, dtype, op); });
  const auto expected_ar =
      local_reference([&](Communicator& c) { return all_reduce_sweep(c, dtype, op); });
  // 100003 elements in 6-byte pieces would take minutes; 4 KiB pieces still split them.
  for (const char* chunk : {"6", "4096"}) {
    ASSERT_EQ(setenv(kChunkEnv, chunk, 1), 0);
    auto comm = make_mpi();
    ASSERT_EQ(unsetenv(kChunkEnv), 0);
    for (size_t count : {size_t{13}, size_t{1000}, size_t{100003}}) {
      if (std::string(chunk) == "6" && count > 1000) continue;
      // reduce_scatter_sweep's outputs: count index * 4 + layout * 2 + in-place.
      const size_t index = static_cast<size_t>(
          std::find(std::begin(kCounts), std::end(kCounts), count) - std::begin(kCounts));
      for (Layout layout : {Layout::kBalanced, Layout::kSkewed}) {
        const Partition part = make_partition(count, comm->size(), layout);
        const size_t w = dtype_size(dtype);
        const Bytes in = make_input(dtype, comm->rank(), count);
        Bytes out(part.count(comm->rank()) * w);
        comm->reduce_scatter({in.data(), count, dtype}, {out.data(), out.size() / w, dtype}, part,
                             op);
        EXPECT_SAME_BYTES(
            out, expected_rs[index * 4 + (layout == Layout::kSkewed ? 2 : 0)],
            fmt::format("{} chunk {}", describe("reduce_scatter", dtype, count, layout), chunk));
      }
      Bytes buf = make_input(dtype, comm->rank(), count);
      comm->all_reduce({buf.data(), count, dtype}, op);
      EXPECT_SAME_BYTES(
          buf, expected_ar[index],
          fmt::format("{} chunk {}", describe("all_reduce", dtype, count, Layout::kBalanced),
                      chunk));
      Bytes root_data = make_input(dtype, 0, count);
      Bytes b = comm->rank() == 0 ? root_data : Bytes(root_data.size());
      comm->broadcast({b.data(), count, dtype}, 0);
      EXPECT_SAME_BYTES(b, root_data,
                        fmt::format("{} chunk {}",
                                    describe("broadcast", dtype, count, Layout::kBalanced), chunk));
    }
  }
}

std::string reduce_param_name(const testing::TestParamInfo<ReduceParam>& param) {
  return fmt::format("{}_{}", dtype_name(param.param.dtype), reduce_op_name(param.param.op));
}

INSTANTIATE_TEST_SUITE_P(AllDtypesAndOps, MpiReduceTest,
                         testing::Values(ReduceParam{DType::kF32, ReduceOp::kSum},
                                         ReduceParam{DType::kF32, ReduceOp::kAvg},
                                         ReduceParam{DType::kF32, ReduceOp::kMax},
                                         ReduceParam{DType::kF16, ReduceOp::kSum},
                                         ReduceParam{DType::kF16, ReduceOp::kAvg},
                                         ReduceParam{DType::kF16, ReduceOp::kMax},
                                         ReduceParam{DType::kBF16, ReduceOp::kSum},
                                         ReduceParam{DType::kBF16, ReduceOp::kAvg},
                                         ReduceParam{DType::kBF16, ReduceOp::kMax}),
                         reduce_param_name);

// ---------------------------------------------------------------------------------------
// Data movement: the expected result is written out directly.

class MpiMoveTest : public testing::TestWithParam<DType> {};

// Rank p's shard is input_value(p, i) at the global indices i of its range, so the gathered
// buffer is one function of the index.
Bytes expected_gather(DType dtype, const Partition& part) {
  Bytes out;
  for (int p = 0; p < part.world_size(); ++p) {
    const Bytes shard = make_input(dtype, p, part.count(p), part.offset(p));
    out.insert(out.end(), shard.begin(), shard.end());
  }
  return out;
}

TEST_P(MpiMoveTest, AllGatherPlacesEveryShardAtItsRange) {
  const DType dtype = GetParam();
  const size_t w = dtype_size(dtype);
  auto comm = make_mpi();
  const int me = comm->rank();
  for (size_t count : kCounts) {
    for (Layout layout : {Layout::kBalanced, Layout::kSkewed}) {
      const Partition part = make_partition(count, comm->size(), layout);
      const Bytes expected = expected_gather(dtype, part);
      const Bytes shard = make_input(dtype, me, part.count(me), part.offset(me));
      Bytes out(count * w, std::byte{0xAB});
      comm->all_gather({shard.data(), part.count(me), dtype}, {out.data(), count, dtype}, part);
      EXPECT_SAME_BYTES(out, expected, describe("all_gather out of place", dtype, count, layout));
      Bytes in_place(count * w, std::byte{0xAB});
      std::copy(shard.begin(), shard.end(),
                in_place.begin() + static_cast<long>(part.offset(me) * w));
      comm->all_gather({in_place.data() + part.offset(me) * w, part.count(me), dtype},
                       {in_place.data(), count, dtype}, part);
      EXPECT_SAME_BYTES(in_place, expected, describe("all_gather in place", dtype, count, layout));
    }
  }
}

TEST_P(MpiMoveTest, BroadcastFromEveryRoot) {
  const DType dtype = GetParam();
  auto comm = make_mpi();
  for (int root = 0; root < comm->size(); ++root) {
    for (size_t count : kCounts) {
      const Bytes expected = make_input(dtype, root, count);
      Bytes buf = comm->rank() == root ? expected : Bytes(expected.size(), std::byte{0xAB});
      comm->broadcast({buf.data(), count, dtype}, root);
      EXPECT_SAME_BYTES(
          buf, expected,
          fmt::format("{} root {}", describe("broadcast", dtype, count, Layout::kBalanced), root));
    }
  }
}

std::string dtype_param_name(const testing::TestParamInfo<DType>& param) {
  return std::string(dtype_name(param.param));
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, MpiMoveTest,
                         testing::Values(DType::kF32, DType::kF16, DType::kBF16), dtype_param_name);

// ---------------------------------------------------------------------------------------
// Two-level collectives (CommOptions::two_level). The reference is the order the option
// promises, computed in this process from every rank's input: for each node, its ranks'
// inputs folded in local rank order and rounded; then the node partials folded in node order.

// The node sizes T with 1 < T < N that divide the world: where two-level is not flat.
std::vector<int> two_level_node_sizes(int n) {
  std::vector<int> sizes;
  for (int t = 2; t < n; ++t) {
    if (n % t == 0) sizes.push_back(t);
  }
  return sizes;
}

constexpr const char* kNoTwoLevel = "no node size T with 1 < T < N divides this world";

// A two-level communicator of `node_ranks` ranks per node, with messages and reduce-scatter
// rounds of at most `chunk` bytes ("default": the backend's own).
std::unique_ptr<Communicator> make_two_level(int node_ranks, const std::string& chunk,
                                             bool two_level = true) {
  CommOptions options = kOptions;
  options.node_ranks = node_ranks;
  options.two_level = two_level;
  if (chunk != "default") {
    EXPECT_EQ(setenv(kChunkEnv, chunk.c_str(), 1), 0);
  }
  auto comm = make_mpi(options);
  EXPECT_EQ(unsetenv(kChunkEnv), 0);
  return comm;
}

// Lengths with ranges of 0, 1 and several elements; with 16-byte chunks every one past the
// first few takes several rounds.
std::vector<size_t> two_level_counts(int n) {
  return {1, static_cast<size_t>(n - 1), static_cast<size_t>(7 * n + 3), 200};
}

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

TEST_P(MpiMoveTest, TwoLevelAllGatherPlacesEveryShardAtItsRange) {
  const DType dtype = GetParam();
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
          const Bytes expected = expected_gather(dtype, part);
          const Bytes shard = make_input(dtype, me, part.count(me), part.offset(me));
          const std::string what = fmt::format(
              "{} T {} chunk {}", describe("two-level all_gather", dtype, count, layout), t, chunk);
          Bytes out(count * w, std::byte{0xAB});
          comm->all_gather({shard.data(), part.count(me), dtype}, {out.data(), count, dtype}, part);
          EXPECT_SAME_BYTES(out, expected, what + " out of place");
          Bytes in_place(count * w, std::byte{0xAB});
          std::copy(shard.begin(), shard.end(),
                    in_place.begin() + static_cast<long>(part.offset(me) * w));
          comm->all_gather({in_place.data() + part.offset(me) * w, part.count(me), dtype},
                           {in_place.data(), count, dtype}, part);
          EXPECT_SAME_BYTES(in_place, expected, what + " in place");
        }
      }
    }
  }
}

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

// ---------------------------------------------------------------------------------------
// Ledger and control traffic.

// hpZ's gather among a node's ranks: every node gathers its own ranks' shards, and the
// ledger counts nothing across nodes.
TEST(MpiNodeAllGatherTwoLevelTest, GathersTheShardsOfThisNodeOnly) {
  for (int per_node = 1; per_node <= world(); ++per_node) {
    if (world() % per_node != 0) continue;
    CommOptions options = kOptions;
    options.node_ranks = per_node;
    auto comm = make_mpi(options);
    const size_t count = 1013;
    const Partition part(count, per_node);
    const int node = my_rank() / per_node;
    const int local = my_rank() % per_node;
    std::vector<float> shard(part.count(local)), out(count, -1.0f);
    for (size_t i = 0; i < shard.size(); ++i) shard[i] = static_cast<float>(my_rank() * 10000 + i);
    comm->node_all_gather_async(std::span<const float>(shard), std::span<float>(out), part).wait();
    for (int l = 0; l < per_node; ++l) {
      for (size_t i = 0; i < part.count(l); ++i) {
        ASSERT_EQ(out[part.offset(l) + i], static_cast<float>((node * per_node + l) * 10000 + i))
            << "nodes of " << per_node << ", local " << l << ", element " << i;
      }
    }
    const CommCounter& c = comm->ledger().total(CommKind::kAllGather);
    EXPECT_EQ(c.bytes, (count - shard.size()) * 4);
    EXPECT_EQ(c.cross_node_bytes, 0u);
  }
}

TEST(MpiLedgerTest, BytesPerCallFollowTheLedgerFormulas) {
  auto comm = make_mpi();
  const int n = comm->size();
  const int me = comm->rank();
  const size_t count = 1001;
  const DType dtype = DType::kBF16;
  const uint64_t w = dtype_size(dtype);
  const Partition skewed = make_partition(count, n, Layout::kSkewed);
  const Partition balanced(count, n);
  Bytes in = make_input(dtype, me, count);
  Bytes shard(skewed.count(me) * w);

  comm->reduce_scatter({in.data(), count, dtype}, {shard.data(), skewed.count(me), dtype}, skewed,
                       ReduceOp::kSum);
  EXPECT_EQ(comm->ledger().total(CommKind::kReduceScatter),
            (CommCounter{1, static_cast<uint64_t>(n - 1) * skewed.count(me) * w}));

  comm->all_gather({shard.data(), skewed.count(me), dtype}, {in.data(), count, dtype}, skewed);
  EXPECT_EQ(comm->ledger().total(CommKind::kAllGather),
            (CommCounter{1, (count - skewed.count(me)) * w}));

  comm->all_reduce({in.data(), count, dtype}, ReduceOp::kAvg);
  EXPECT_EQ(comm->ledger().total(CommKind::kAllReduce),
            (CommCounter{1, (static_cast<uint64_t>(n - 1) * balanced.count(me) +
                             (count - balanced.count(me))) *
                                w}));

  comm->broadcast({in.data(), count, dtype}, n - 1);
  EXPECT_EQ(comm->ledger().total(CommKind::kBroadcast),
            (CommCounter{1, me == n - 1 ? 0 : count * w}));

  const std::vector<double> three = {1, 2, 3};
  (void)comm->gather_control(three);
  EXPECT_EQ(comm->ledger().total(CommKind::kControl),
            (CommCounter{1, static_cast<uint64_t>(n - 1) * 3 * sizeof(double)}));

  // Summed over ranks, a reduce-scatter or all-gather moves (N-1) * C * w: the ring's volume.
  const double rs_total =
      comm->sum_control(static_cast<double>(comm->ledger().total(CommKind::kReduceScatter).bytes));
  EXPECT_EQ(rs_total, static_cast<double>((n - 1) * count * w));
  const double ag_total =
      comm->sum_control(static_cast<double>(comm->ledger().total(CommKind::kAllGather).bytes));
  EXPECT_EQ(ag_total, static_cast<double>((n - 1) * count * w));
}

TEST(MpiControlTest, GatherControlIsRankMajor) {
  auto comm = make_mpi();
  const int n = comm->size();
  for (size_t k : {size_t{0}, size_t{1}, size_t{3}, size_t{1000}}) {
    std::vector<double> mine(k);
    for (size_t j = 0; j < k; ++j) mine[j] = comm->rank() * 1000.0 + static_cast<double>(j) + 0.25;
    const std::vector<double> all = comm->gather_control(mine);
    ASSERT_EQ(all.size(), k * static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      for (size_t j = 0; j < k; ++j) {
        EXPECT_EQ(all[static_cast<size_t>(r) * k + j], r * 1000.0 + static_cast<double>(j) + 0.25)
            << "k " << k << " rank " << r << " value " << j;
      }
    }
  }
}

TEST(MpiControlTest, SumAndMaxControlMatchLocalBackend) {
  // Values whose sum depends on the order, so rank order is checked.
  auto body = [](Communicator& c) {
    const double x = c.rank() % 2 == 0 ? 1e16 * (c.rank() + 1) : -1e16 * c.rank() + 1.5;
    const std::vector<double> v = {x, 0.1 * c.rank(), -x};
    std::vector<double> out = c.sum_control(std::span<const double>(v));
    out.push_back(c.sum_control(x));
    out.push_back(c.max_control(0.1 * c.rank()));
    c.barrier();
    return out;
  };
  const std::vector<double> expected = local_reference(body);
  auto comm = make_mpi();
  const std::vector<double> actual = body(*comm);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_EQ(std::memcmp(&actual[i], &expected[i], sizeof(double)), 0)
        << "value " << i << ": " << actual[i] << " vs " << expected[i];
  }
}

// ---------------------------------------------------------------------------------------
// Creation and failure. Each test uses its own communicator, so a broken one cannot
// disturb the next test; a second communicator keeps the ranks in step.

TEST(MpiSessionTest, ReportsTheJob) {
  EXPECT_TRUE(mpi_backend_available());
  auto comm = make_mpi();
  EXPECT_EQ(comm->backend_name(), "mpi");
  EXPECT_EQ(comm->rank(), my_rank());
  EXPECT_EQ(comm->size(), world());
}

TEST(MpiSessionTest, RejectsAChunkSizeTheRanksDisagreeOn) {
  if (world() < 2) GTEST_SKIP() << "one rank cannot disagree with itself";
  ASSERT_EQ(setenv(kChunkEnv, my_rank() == 0 ? "4096" : "8192", 1), 0);
  try {
    auto comm = make_mpi();
    ADD_FAILURE() << "make_communicator accepted different chunk sizes";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(kChunkEnv), std::string::npos) << e.what();
  }
  ASSERT_EQ(setenv(kChunkEnv, "0", 1), 0);
  EXPECT_THROW((void)make_mpi(), InvalidArgument);
  ASSERT_EQ(unsetenv(kChunkEnv), 0);
  EXPECT_THROW((void)make_mpi(CommOptions{.timeout_seconds = 0}), InvalidArgument);
}

TEST(MpiFailureTest, AbortFailsPeersCollectivesNamingTheRank) {
  auto sync = make_mpi();
  auto comm = make_mpi();
  const int culprit = world() - 1;
  const size_t count = 64;
  Bytes buf = make_input(DType::kF32, my_rank(), count);
  if (my_rank() == culprit) {
    comm->abort("injected failure");
    // Its own next collective fails at once, naming itself.
    try {
      comm->all_reduce({buf.data(), count, DType::kF32}, ReduceOp::kSum);
      ADD_FAILURE() << "all_reduce on the aborted rank succeeded";
    } catch (const CommError& e) {
      EXPECT_EQ(e.failed_rank(), culprit);
      EXPECT_NE(std::string(e.what()).find("injected failure"), std::string::npos) << e.what();
    }
  } else {
    const auto start = std::chrono::steady_clock::now();
    try {
      comm->all_reduce({buf.data(), count, DType::kF32}, ReduceOp::kSum);
      ADD_FAILURE() << "all_reduce succeeded although rank " << culprit << " aborted";
    } catch (const CommError& e) {
      EXPECT_EQ(e.failed_rank(), culprit) << e.what();
      const std::string what = e.what();
      EXPECT_NE(what.find(fmt::format("rank {} failed", culprit)), std::string::npos) << what;
      EXPECT_NE(what.find("injected failure"), std::string::npos) << what;
    }
    // Well before the 60 s timeout: the notice, not the clock, ended the wait.
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
    // Later collectives fail the same way, without waiting.
    EXPECT_THROW(comm->barrier(), CommError);
  }
  sync->barrier();
}

TEST(MpiFailureTest, AbortEndsThisRanksPendingCollective) {
  if (world() < 2) GTEST_SKIP() << "a collective of one rank never waits";
  auto sync = make_mpi();
  auto comm = make_mpi();
  if (my_rank() == 0) {
    // No peer ever joins this all-gather; abort() must end the wait, not the 60 s timeout.
    const size_t count = world() * size_t{4};
    Bytes out(count * 4);
    const Partition part(count, world());
    Work work = comm->all_gather_async({out.data(), 4, DType::kF32},
                                       {out.data(), count, DType::kF32}, part);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const auto start = std::chrono::steady_clock::now();
    comm->abort("stopping on purpose");
    EXPECT_THROW(work.wait(), CommError);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  }
  sync->barrier();
}

TEST(MpiFailureTest, TimeoutNamesTheRankThatDidNotArrive) {
  if (world() < 2) GTEST_SKIP() << "a collective of one rank never waits";
  auto sync = make_mpi();
  auto comm = make_mpi(CommOptions{.timeout_seconds = 0.5});
  if (my_rank() != 0) {
    const size_t count = 12;
    const Partition part(count, world());
    Bytes out(count * 4);
    const auto start = std::chrono::steady_clock::now();
    try {
      comm->all_gather(
          {out.data() + part.offset(my_rank()) * 4, part.count(my_rank()), DType::kF32},
          {out.data(), count, DType::kF32}, part);
      ADD_FAILURE() << "all_gather succeeded without rank 0";
    } catch (const CommTimeout& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.failed_rank(), 0) << what;
      EXPECT_NE(what.find("all_gather"), std::string::npos) << what;
      EXPECT_NE(what.find("timed out"), std::string::npos) << what;
      EXPECT_NE(what.find("waiting for rank 0 "), std::string::npos) << what;
    }
    const auto waited = std::chrono::steady_clock::now() - start;
    EXPECT_GE(waited, std::chrono::milliseconds(500));
    EXPECT_LT(waited, std::chrono::seconds(10));
  }
  sync->barrier();
}

// Two-level, a rank waits only for the peers of its phases: with rank 0 absent (and no
// fingerprint exchange, which would wait for everyone), the ranks of local index 0 time out
// across nodes and those of node 0 inside it, naming rank 0; any other rank finishes the
// cross-node phase and then waits for its node's rank of local index 0, stuck in that phase.
TEST(MpiFailureTest, TwoLevelTimeoutNamesThePeerThatDidNotArrive) {
  const int n = world();
  if (two_level_node_sizes(n).empty()) GTEST_SKIP() << kNoTwoLevel;
  const int t = two_level_node_sizes(n).back();
  auto sync = make_mpi();
  auto comm = make_mpi(CommOptions{
      .timeout_seconds = 0.5, .check_collectives = false, .node_ranks = t, .two_level = true});
  const int me = my_rank();
  if (me != 0) {
    const int expected = me % t == 0 || me / t == 0 ? 0 : me / t * t;
    const size_t count = static_cast<size_t>(4 * n);
    const Partition part(count, n);
    Bytes out(count * 4);
    try {
      comm->all_gather({out.data() + part.offset(me) * 4, part.count(me), DType::kF32},
                       {out.data(), count, DType::kF32}, part);
      ADD_FAILURE() << "all_gather succeeded without rank 0";
    } catch (const CommTimeout& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.failed_rank(), expected) << "T " << t << ": " << what;
      EXPECT_NE(what.find(fmt::format("waiting for rank {} ", expected)), std::string::npos)
          << "T " << t << ": " << what;
    }
  }
  sync->barrier();
}

// ---------------------------------------------------------------------------------------
// Ranks as threads of the MPI processes (MpiSession::make_communicators): T ranks per
// process, world() * T in all. The ranks of a process read each other's buffers in place
// and only other processes' bytes go through MPI; the results and ledgers must be the
// local backend's for the same world and options, bit for bit.

// Runs `body` on the T ranks this process hosts, one thread each; the results by local index.
template <typename Body>
auto run_as_threads(int t, const CommOptions& options, const Body& body) {
  auto comms = g_session->make_communicators(options, t);
  std::vector<decltype(body(std::declval<Communicator&>()))> results(static_cast<size_t>(t));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(t));
  std::vector<std::thread> threads;
  for (int l = 0; l < t; ++l) {
    threads.emplace_back([&, l] {
      try {
        results[static_cast<size_t>(l)] = body(*comms[static_cast<size_t>(l)]);
      } catch (...) {
        errors[static_cast<size_t>(l)] = std::current_exception();
        comms[static_cast<size_t>(l)]->abort("the test body threw");
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return results;
}

struct ThreadsParam {
  int t;           // ranks per process
  int node_ranks;  // 0: one node
  bool two_level;
  int qgz_bits;
};
void PrintTo(const ThreadsParam& p, std::ostream* os) {
  *os << fmt::format("T {} node_ranks {} {} qgz {}", p.t, p.node_ranks,
                     p.two_level ? "two-level" : "flat", p.qgz_bits);
}

// Every collective, outputs and ledger totals in one list.
std::vector<Bytes> every_collective(Communicator& c, bool quantized) {
  std::vector<Bytes> out;
  auto append = [&](std::vector<Bytes> more) {
    for (auto& b : more) out.push_back(std::move(b));
  };
  append(reduce_scatter_sweep(c, DType::kBF16, ReduceOp::kAvg));
  append(reduce_scatter_sweep(c, DType::kF32, ReduceOp::kSum));
  if (!quantized) append(reduce_scatter_sweep(c, DType::kF16, ReduceOp::kMax));
  append(sum_into_sweep(c, DType::kBF16));
  append(all_reduce_sweep(c, DType::kF32, ReduceOp::kSum));
  const int me = c.rank();
  for (size_t count : kCounts) {
    for (Layout layout : {Layout::kBalanced, Layout::kSkewed}) {
      const Partition part = make_partition(count, c.size(), layout);
      const Bytes shard = make_input(DType::kBF16, me, part.count(me), part.offset(me));
      Bytes gathered(count * 2, std::byte{0xAB});
      c.all_gather({shard.data(), part.count(me), DType::kBF16},
                   {gathered.data(), count, DType::kBF16}, part);
      out.push_back(gathered);
    }
  }
  for (int root = 0; root < c.size(); root += std::max(1, c.size() / 3)) {
    Bytes buf = make_input(DType::kF32, c.rank() == root ? root : 100 + c.rank(), 1000);
    c.broadcast({buf.data(), 1000, DType::kF32}, root);
    out.push_back(buf);
  }
  const std::vector<double> mine = {1e16 * (me + 1), 0.1 * me};
  const std::vector<double> all = c.gather_control(mine);
  out.emplace_back(reinterpret_cast<const std::byte*>(all.data()),
                   reinterpret_cast<const std::byte*>(all.data() + all.size()));
  for (CommKind kind : {CommKind::kReduceScatter, CommKind::kAllGather, CommKind::kAllReduce,
                        CommKind::kBroadcast, CommKind::kControl}) {
    const CommCounter& k = c.ledger().total(kind);
    const uint64_t v[] = {k.calls, k.bytes, k.cross_node_bytes};
    out.emplace_back(reinterpret_cast<const std::byte*>(v),
                     reinterpret_cast<const std::byte*>(v + 3));
  }
  return out;
}

// `body`'s outputs on every rank of world() * t ranks, run as t threads per process, equal
// the local backend's for the same world and options, in the default chunks and in 4 KiB
// ones.
template <typename Body>
void expect_threads_match_local(int t, const CommOptions& options, const Body& body,
                                const std::string& what) {
  const int n = world() * t;
  std::vector<std::vector<Bytes>> expected(static_cast<size_t>(n));
  run_local(n, options,
            [&](Communicator& c) { expected[static_cast<size_t>(c.rank())] = body(c); });
  for (const char* chunk : {"default", "4096"}) {
    if (std::string(chunk) != "default") {
      ASSERT_EQ(setenv(kChunkEnv, chunk, 1), 0);
    }
    const auto actual = run_as_threads(
        t, options, [&](Communicator& c) { return std::make_pair(c.rank(), body(c)); });
    ASSERT_EQ(unsetenv(kChunkEnv), 0);
    for (const auto& [rank, outputs] : actual) {
      const auto& want = expected[static_cast<size_t>(rank)];
      ASSERT_EQ(outputs.size(), want.size());
      for (size_t i = 0; i < outputs.size(); ++i) {
        EXPECT_SAME_BYTES(
            outputs[i], want[i],
            fmt::format("{}: rank {} of {}, entry {}, chunk {}", what, rank, n, i, chunk));
      }
    }
  }
}

class MpiThreadsTest : public testing::TestWithParam<ThreadsParam> {};

TEST_P(MpiThreadsTest, EveryCollectiveMatchesLocalBackend) {
  const ThreadsParam p = GetParam();
  const int n = world() * p.t;
  if (p.node_ranks > 0 && n % p.node_ranks != 0) GTEST_SKIP() << "nodes do not divide the world";
  if (p.node_ranks > 0 && p.node_ranks % p.t != 0 && world() > 1) {
    GTEST_SKIP() << "a process spans nodes only when it holds the whole world";
  }
  CommOptions options = kOptions;
  options.node_ranks = p.node_ranks;
  options.two_level = p.two_level;
  options.qgz_bits = p.qgz_bits;
  const bool quantized = p.qgz_bits != 0;
  expect_threads_match_local(
      p.t, options, [&](Communicator& c) { return every_collective(c, quantized); },
      fmt::format("T {} node_ranks {}", p.t, p.node_ranks));
}

INSTANTIATE_TEST_SUITE_P(Modes, MpiThreadsTest,
                         testing::Values(ThreadsParam{2, 0, false, 0}, ThreadsParam{3, 0, false, 0},
                                         ThreadsParam{2, 2, true, 0}, ThreadsParam{2, 4, true, 0},
                                         ThreadsParam{3, 3, true, 0}, ThreadsParam{2, 2, false, 4},
                                         ThreadsParam{3, 3, true, 8},
                                         // One process holding every node (np 1).
                                         ThreadsParam{4, 2, true, 0}, ThreadsParam{4, 2, false, 4},
                                         ThreadsParam{4, 1, true, 8}),
                         [](const testing::TestParamInfo<ThreadsParam>& param) {
                           const ThreadsParam& p = param.param;
                           return fmt::format("T{}_node{}_{}_qgz{}", p.t, p.node_ranks,
                                              p.two_level ? "twolevel" : "flat", p.qgz_bits);
                         });

// Communicator::split under MPI: islands (ranks / 2) and columns (ranks % 2), with one rank
// per process (every group across processes) and two (an island is a process's two threads,
// a column one rank per process). Each group sums its own ranks, numbers them in key order,
// and a group split from a group is refused.
TEST(MpiThreadsTest, SplitGroupsSumTheirOwnRanks) {
  for (int t : {1, 2}) {
    const int n = world() * t;
    if (n % 2 != 0) continue;
    const auto results = run_as_threads(t, kOptions, [&](Communicator& c) {
      const int r = c.rank();
      auto island = c.split(r / 2, r, kOptions);
      auto column = c.split(r % 2, -r, kOptions);  // keys reversed: column ranks count down
      std::vector<float> a = {static_cast<float>(r + 1)};
      std::vector<float> b = a;
      island->all_reduce(std::span<float>(a), ReduceOp::kSum);
      column->all_reduce(std::span<float>(b), ReduceOp::kSum);
      bool nested_refused = false;
      try {
        (void)island->split(0, 0, kOptions);
      } catch (const InvalidArgument&) {
        nested_refused = true;
      }
      return std::vector<double>{a[0],
                                 b[0],
                                 double(island->rank()),
                                 double(island->size()),
                                 double(column->rank()),
                                 double(column->size()),
                                 double(nested_refused)};
    });
    for (int l = 0; l < t; ++l) {
      const int r = my_rank() * t + l;
      double column_sum = 0;
      for (int q = r % 2; q < n; q += 2) column_sum += q + 1;
      const std::vector<double> want = {double(2 * (r / 2) + 1 + 2 * (r / 2) + 2),
                                        column_sum,
                                        double(r % 2),
                                        2,
                                        double(n / 2 - 1 - r / 2),
                                        double(n / 2),
                                        1};
      EXPECT_EQ(results[static_cast<size_t>(l)], want) << "rank " << r << " of " << n;
    }
  }
}

TEST(MpiThreadsTest, NodeAllGatherMatchesTheShardsOfTheNode) {
  for (int t : {2, 3}) {
    CommOptions options = kOptions;
    options.node_ranks = t;
    // Each rank thread says what it found wrong ("" when nothing): a value, or the ledger.
    const auto wrong = run_as_threads(t, options, [&](Communicator& c) -> std::string {
      const size_t count = 1013;
      const Partition part(count, t);
      const int local = c.rank() % t;
      std::vector<float> shard(part.count(local)), out(count, -1.0f);
      for (size_t i = 0; i < shard.size(); ++i) shard[i] = static_cast<float>(c.rank() * 10000 + i);
      c.node_all_gather_async(std::span<const float>(shard), std::span<float>(out), part).wait();
      for (int l = 0; l < t; ++l) {
        for (size_t i = 0; i < part.count(l); ++i) {
          const float want = static_cast<float>((c.rank() - local + l) * 10000 + i);
          if (out[part.offset(l) + i] != want) {
            return fmt::format("element {} of local {}'s shard is {}, want {}", i, l,
                               out[part.offset(l) + i], want);
          }
        }
      }
      const uint64_t bytes = c.ledger().total(CommKind::kAllGather).bytes;
      if (bytes != (count - shard.size()) * 4) {
        return fmt::format("the ledger has {} all-gather bytes, want {}", bytes,
                           (count - shard.size()) * 4);
      }
      return "";
    });
    for (int l = 0; l < t; ++l)
      EXPECT_EQ(wrong[static_cast<size_t>(l)], "") << "T " << t << " local " << l;
  }
}

// A rank that aborts fails everyone's next collective naming it: the ranks of its own
// process through the group, the others by a notice.
TEST(MpiThreadsTest, AbortFailsEveryRankNamingIt) {
  const int t = 2;
  const int culprit = 1;  // the second rank of process 0
  auto sync = make_mpi();
  const auto errors = run_as_threads(t, kOptions, [&](Communicator& c) {
    std::vector<float> buf(64, 1.0f);
    if (c.rank() == culprit) c.abort("injected failure");
    try {
      c.all_reduce(std::span<float>(buf), ReduceOp::kSum);
    } catch (const CommError& e) {
      return std::make_pair(e.failed_rank(), std::string(e.what()));
    }
    return std::make_pair(-2, std::string("no error"));
  });
  for (const auto& [failed, what] : errors) {
    EXPECT_EQ(failed, culprit) << what;
    EXPECT_NE(what.find("injected failure"), std::string::npos) << what;
  }
  sync->barrier();
}

TEST(MpiThreadsTest, RefusesRanksPerProcessThatSplitANode) {
  EXPECT_THROW((void)g_session->make_communicators(kOptions, 0), InvalidArgument);
  CommOptions options = kOptions;
  options.node_ranks = 3;
  try {
    (void)g_session->make_communicators(options, 2);
    ADD_FAILURE() << "2 ranks per process over nodes of 3 were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--node-ranks 3"), std::string::npos) << e.what();
  }
}

// HSDP's reduction (node_reduce_scatter) against the local backend: every node size T that
// divides the world, one rank per process and as threads, default and 4 KiB chunks, in place
// and into a separate buffer; outputs and ledgers equal.
std::vector<Bytes> node_reduce_sweep(Communicator& c, int t) {
  std::vector<Bytes> out;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{100003}}) {
        const Partition part(count, t);
        const int l = c.rank() % t;
        const size_t w = dtype_size(dtype);
        const Bytes in = make_input(dtype, c.rank(), count);
        Bytes separate(part.count(l) * w, std::byte{0xAB});
        c.node_reduce_scatter_async({in.data(), count, dtype},
                                    {separate.data(), part.count(l), dtype}, part, op)
            .wait();
        out.push_back(separate);
        Bytes in_place = in;
        std::byte* own = in_place.data() + part.offset(l) * w;
        c.node_reduce_scatter_async({in_place.data(), count, dtype}, {own, part.count(l), dtype},
                                    part, op)
            .wait();
        out.emplace_back(own, own + part.count(l) * w);
      }
    }
  }
  const CommCounter& k = c.ledger().total(CommKind::kReduceScatter);
  const uint64_t v[] = {k.calls, k.bytes, k.cross_node_bytes};
  out.emplace_back(reinterpret_cast<const std::byte*>(v),
                   reinterpret_cast<const std::byte*>(v + 3));
  return out;
}

TEST(MpiNodeReduceScatterTwoLevelTest, MatchesLocalBackend) {
  // Four per process only at np 1: one process holding every node.
  for (int per_process : {1, 2, 4}) {
    if (per_process == 4 && world() > 1) continue;
    const int n = world() * per_process;
    for (int t = 1; t <= n; ++t) {
      if (n % t != 0 || (t % per_process != 0 && per_process != n)) continue;
      CommOptions options = kOptions;
      options.node_ranks = t;
      expect_threads_match_local(
          per_process, options, [&](Communicator& c) { return node_reduce_sweep(c, t); },
          fmt::format("node_reduce_scatter, nodes of {} ({} per process)", t, per_process));
    }
  }
}

// Non-zero ranks print only failures, each line naming the rank.
class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  // The test's name is kept here: UnitTest::current_test_info() would take the lock that
  // gtest holds while it reports a result.
  void OnTestStart(const testing::TestInfo& test) override {
    test_ = fmt::format("{}.{}", test.test_suite_name(), test.name());
  }
  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] FAILED %s at %s:%d\n%s\n", rank_, test_.c_str(),
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }

 private:
  int rank_;
  std::string test_;
};

}  // namespace
}  // namespace zerodp

// MPI is initialized once per process, so this test brings its own main: it runs the tests
// on every rank and returns failure if any rank failed.
int main(int argc, char** argv) {
  zerodp::MpiSession session(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  zerodp::g_session = &session;
  if (session.rank() != 0) {
    testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new zerodp::RankFailurePrinter(session.rank()));
  }
  const int result = RUN_ALL_TESTS();
  double failed_ranks = 0;
  {
    auto comm = session.make_communicator(zerodp::kOptions);
    failed_ranks = comm->sum_control(result != 0 ? 1.0 : 0.0);
  }
  if (session.rank() == 0 && failed_ranks > 0) {
    std::fprintf(stderr, "%g of %d ranks failed\n", failed_ranks, session.size());
  }
  return failed_ranks > 0 ? 1 : 0;
}
