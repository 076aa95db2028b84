// The mpi backend against the local backend: for the same world size and inputs, every
// collective gives the same bytes. Each MPI process also runs a LocalWorld of N threads with
// the same test body and compares its own rank's output. Run under mpirun -np 2, 3, 4
// (ctest label `mpi`); the main below owns MPI and agrees on one exit code for all ranks.
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <gtest/gtest.h>

#include "comm/mpi.h"
#include "comm_mpi_testing.h"
#include "core/error.h"

namespace zerodp::mpi_test {
namespace {

// ---------------------------------------------------------------------------------------
// Reductions, parameterized by dtype and op: the same body under both backends.

class MpiReduceTest : public testing::TestWithParam<ReduceParam> {};

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

// sum_into in the default chunks and in 4 KiB ones (rounds that cut 16-bit inputs and the fp32
// accumulator at different byte offsets), byte for byte the local backend's.
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
}  // namespace zerodp::mpi_test

// MPI is initialized once per process, so this test brings its own main: it runs the tests
// on every rank and returns failure if any rank failed.
int main(int argc, char** argv) {
  zerodp::MpiSession session(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  zerodp::mpi_test::g_session = &session;
  if (session.rank() != 0) {
    testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new zerodp::mpi_test::RankFailurePrinter(session.rank()));
  }
  const int result = RUN_ALL_TESTS();
  double failed_ranks = 0;
  {
    auto comm = session.make_communicator(zerodp::mpi_test::kOptions);
    failed_ranks = comm->sum_control(result != 0 ? 1.0 : 0.0);
  }
  if (session.rank() == 0 && failed_ranks > 0) {
    std::fprintf(stderr, "%g of %d ranks failed\n", failed_ranks, session.size());
  }
  return failed_ranks > 0 ? 1 : 0;
}