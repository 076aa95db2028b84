// What the mpi backend's tests share (comm_mpi_test.cc and its neighbours, one binary run
// under mpirun): the session, the inputs every rank can compute for every other, the
// layouts, the comparison with the local backend, and the two-level communicators.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <gtest/gtest.h>

#include "comm/local.h"
#include "comm/mpi.h"

namespace zerodp {

// Ledger mismatches print as numbers (found by argument-dependent lookup, so outside the
// unnamed namespace).
inline void PrintTo(const CommCounter& c, std::ostream* os) {
  *os << fmt::format("{{calls {}, bytes {}, cross-node bytes {}}}", c.calls, c.bytes,
                     c.cross_node_bytes);
}

namespace mpi_test {

inline MpiSession* g_session = nullptr;  // set by main() for the life of the tests

inline const CommOptions kOptions{.timeout_seconds = 60};
inline constexpr size_t kCounts[] = {0, 1, 7, 13, 1000, 100003};
inline constexpr const char* kChunkEnv = "ZERODP_MPI_CHUNK_BYTES";

using Bytes = std::vector<std::byte>;

inline std::unique_ptr<Communicator> make_mpi(const CommOptions& options = kOptions) {
  return g_session->make_communicator(options);
}
inline int world() { return g_session->size(); }
inline int my_rank() { return g_session->rank(); }

// A value of rank `rank` at index `i`: magnitudes 2^-12..2^12, both signs, 21 mantissa bits,
// so fp32 sums depend on their order and 16-bit rounding matters.
inline float input_value(int rank, size_t i) {
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
inline Bytes make_input(DType dtype, int rank, size_t count, size_t first = 0) {
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
inline long first_difference(const Bytes& a, const Bytes& b) {
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
inline Partition make_partition(size_t count, int n, Layout layout) {
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

inline std::string describe(std::string_view op, DType dtype, size_t count, Layout layout) {
  return fmt::format("{} {} count {} {} world {}", op, dtype_name(dtype), count,
                     layout == Layout::kBalanced ? "balanced" : "skewed", world());
}

// Runs `body` on a LocalWorld of world() threads and returns what rank my_rank() produced:
// the reference the mpi backend must match byte for byte.
template <typename Body>
inline auto local_reference(const Body& body, const CommOptions& options = kOptions) {
  std::vector<decltype(body(std::declval<Communicator&>()))> results(static_cast<size_t>(world()));
  run_local(world(), options,
            [&](Communicator& c) { results[static_cast<size_t>(c.rank())] = body(c); });
  return results[static_cast<size_t>(my_rank())];
}

// The reductions' parameter: a dtype and an op.
struct ReduceParam {
  DType dtype;
  ReduceOp op;
};
inline void PrintTo(const ReduceParam& p, std::ostream* os) {
  *os << dtype_name(p.dtype) << " " << reduce_op_name(p.op);
}

inline std::string reduce_param_name(const testing::TestParamInfo<ReduceParam>& param) {
  return fmt::format("{}_{}", dtype_name(param.param.dtype), reduce_op_name(param.param.op));
}

// Two-level collectives (CommOptions::two_level).

// The node sizes T with 1 < T < N that divide the world: where two-level is not flat.
inline std::vector<int> two_level_node_sizes(int n) {
  std::vector<int> sizes;
  for (int t = 2; t < n; ++t) {
    if (n % t == 0) sizes.push_back(t);
  }
  return sizes;
}

inline constexpr const char* kNoTwoLevel = "no node size T with 1 < T < N divides this world";

// A two-level communicator of `node_ranks` ranks per node, with messages and reduce-scatter
// rounds of at most `chunk` bytes ("default": the backend's own).
inline std::unique_ptr<Communicator> make_two_level(int node_ranks, const std::string& chunk,
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
inline std::vector<size_t> two_level_counts(int n) {
  return {1, static_cast<size_t>(n - 1), static_cast<size_t>(7 * n + 3), 200};
}

// The reductions' sweeps, every output in order: the reductions' tests run them under both
// backends, the threads' tests with ranks as threads.

// Every count and layout: reduce-scatter into a separate buffer, then in place.
inline std::vector<Bytes> reduce_scatter_sweep(Communicator& c, DType dtype, ReduceOp op) {
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

inline std::vector<Bytes> all_reduce_sweep(Communicator& c, DType dtype, ReduceOp op) {
  std::vector<Bytes> outputs;
  for (size_t count : kCounts) {
    Bytes buf = make_input(dtype, c.rank(), count);
    c.all_reduce({buf.data(), count, dtype}, op);
    outputs.push_back(std::move(buf));
  }
  return outputs;
}

// sum_into: three micro-steps of every count and layout into fp32 accumulators.
inline std::vector<Bytes> sum_into_sweep(Communicator& c, DType dtype) {
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

}  // namespace mpi_test
}  // namespace zerodp
