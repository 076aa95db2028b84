// The mpi backend with ranks as threads of the MPI processes, and its HSDP reduction: part
// of comm_mpi_test (its main is in comm_mpi_test.cc).
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <gtest/gtest.h>

#include "comm/quantize.h"
#include "comm_mpi_testing.h"
#include "core/error.h"

namespace zerodp::mpi_test {
namespace {

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

}  // namespace
}  // namespace zerodp::mpi_test
