// zerodp bench-comm: every collective, dtype and size, timed and checked, in the manner of
// nccl-tests. Each row: the full buffer size S, time per call (the slowest rank's mean),
// algbw = S / time, busbw = algbw x (2(n-1)/n for all_reduce, (n-1)/n for reduce_scatter and
// all_gather, 1 for broadcast), and #wrong: elements that differ from the exact result.
// With --node-ranks T (consecutive ranks share a host), host_MB/s: the bytes that entered a
// host from the other hosts per second (the comm ledger's cross-node bytes of its ranks), the
// rate a host's NIC sustained: the figure to give train's and estimate's
// --inter-node-bandwidth.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "comm/launch.h"
#include "comm/world_shape.h"
#include "commands.h"
#include "core/error.h"
#include "core/sysinfo.h"
#include "core/units.h"

namespace zerodp::cli {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kMaxTimeoutSeconds = 1e6;

enum class Op { kAllReduce, kReduceScatter, kAllGather, kBroadcast };

struct OpInfo {
  Op op;
  const char* name;
};
constexpr OpInfo kOps[] = {{Op::kAllReduce, "all_reduce"},
                           {Op::kReduceScatter, "reduce_scatter"},
                           {Op::kAllGather, "all_gather"},
                           {Op::kBroadcast, "broadcast"}};

struct Config {
  std::string backend = "local";
  int ranks = 2;
  bool ranks_given = false;
  int ranks_per_process = 1;
  int node_ranks = 0;  // 0: every rank on one host
  std::vector<std::string> ops = {"all_reduce", "reduce_scatter", "all_gather", "broadcast"};
  std::vector<std::string> dtypes = {"f32", "bf16", "f16"};
  std::string min_bytes = "1KiB";
  std::string max_bytes = "256MiB";
  int factor = 4;
  double seconds_per_row = 0.25;
  int max_iters = 1000;
  double timeout = 300;
  bool json = false;
};

double bus_factor(Op op, int n) {
  switch (op) {
    case Op::kAllReduce:
      return 2.0 * (n - 1) / n;
    case Op::kReduceScatter:
    case Op::kAllGather:
      return static_cast<double>(n - 1) / n;
    case Op::kBroadcast:
      return 1.0;
  }
  return 1.0;
}

// Small integers: exact in every dtype, so sums are exact and #wrong must be 0.
float element_value(int rank, size_t i) { return static_cast<float>(rank % 4 + 1 + (i % 3)); }

void fill(std::vector<std::byte>& buf, DType t, size_t count, int rank) {
  for (size_t i = 0; i < count; ++i) {
    const float v = element_value(rank, i);
    if (t == DType::kF32) {
      std::memcpy(buf.data() + 4 * i, &v, 4);
    } else if (t == DType::kBF16) {
      const BFloat16 b = to_bf16(v);
      std::memcpy(buf.data() + 2 * i, &b, 2);
    } else {
      const Float16 h = to_f16(v);
      std::memcpy(buf.data() + 2 * i, &h, 2);
    }
  }
}

float read_element(const std::vector<std::byte>& buf, DType t, size_t i) {
  if (t == DType::kF32) {
    float v;
    std::memcpy(&v, buf.data() + 4 * i, 4);
    return v;
  }
  uint16_t bits;
  std::memcpy(&bits, buf.data() + 2 * i, 2);
  return t == DType::kBF16 ? to_f32(BFloat16{bits}) : to_f32(Float16{bits});
}

struct Row {
  std::string op;
  DType dtype;
  uint64_t bytes;
  double time_us;
  double algbw;
  double busbw;
  double host_rate;  // bytes per second into a host from the others; 0 without --node-ranks
  uint64_t wrong;
  int iters;
};

class Bench {
 public:
  Bench(Communicator& comm, const Config& cfg) : comm_(comm), cfg_(cfg) {}

  // Runs one (op, dtype, size) row on every rank; returns the row as rank 0 sees it.
  Row run(const OpInfo& info, DType t, size_t count) {
    const int n = comm_.size();
    const int me = comm_.rank();
    const size_t w = dtype_size(t);
    const Partition part(count, n);
    in_.assign(count * w, std::byte{0});
    out_.assign(count * w, std::byte{0});

    auto call = [&] {
      switch (info.op) {
        case Op::kAllReduce:
          comm_.all_reduce(MutableBuffer(in_.data(), count, t), ReduceOp::kSum);
          break;
        case Op::kReduceScatter:
          comm_.reduce_scatter(ConstBuffer(in_.data(), count, t),
                               MutableBuffer(out_.data(), part.count(me), t), part, ReduceOp::kSum);
          break;
        case Op::kAllGather:
          comm_.all_gather(ConstBuffer(in_.data() + part.offset(me) * w, part.count(me), t),
                           MutableBuffer(out_.data(), count, t), part);
          break;
        case Op::kBroadcast:
          comm_.broadcast(MutableBuffer(in_.data(), count, t), 0);
          break;
      }
    };

    // Correctness first, on fresh inputs.
    fill(in_, t, count, me);
    call();
    const uint64_t wrong = count_wrong(info.op, t, count, part);

    // Calibrate: as many iterations as fit the time per row, agreed across ranks.
    call();
    comm_.barrier();
    auto t0 = Clock::now();
    call();
    const double one = std::chrono::duration<double>(Clock::now() - t0).count();
    const double slowest = comm_.max_control(one);
    // Clamped as a double: the quotient can exceed any int.
    const int iters = static_cast<int>(std::clamp(cfg_.seconds_per_row / std::max(slowest, 1e-7),
                                                  1.0, static_cast<double>(cfg_.max_iters)));
    comm_.barrier();
    const double cross_before = cross_bytes();
    t0 = Clock::now();
    for (int i = 0; i < iters; ++i) call();
    const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    const double crossed = cross_bytes() - cross_before;  // before the control exchanges below
    const double time_s = comm_.max_control(elapsed) / iters;
    // Every host's ranks together, per host: the collectives are symmetric over hosts.
    const double cross = comm_.sum_control(crossed);
    const double total_wrong = comm_.sum_control(static_cast<double>(wrong));

    Row row;
    row.op = info.name;
    row.dtype = t;
    row.bytes = count * w;
    row.time_us = time_s * 1e6;
    row.algbw = static_cast<double>(row.bytes) / time_s / 1e9;
    row.busbw = row.algbw * bus_factor(info.op, n);
    const int hosts = cfg_.node_ranks > 0 ? n / cfg_.node_ranks : 1;
    row.host_rate = cfg_.node_ranks > 0 ? cross / hosts / iters / time_s : 0;
    row.wrong = static_cast<uint64_t>(total_wrong);
    row.iters = iters;
    return row;
  }

 private:
  // This rank's cross-host bytes so far, every data-moving kind (not the control values the
  // bench's own timing exchanges).
  double cross_bytes() const {
    uint64_t b = 0;
    for (const CommPhase phase : {CommPhase::kTrain, CommPhase::kOther}) {
      const CommLedger::Table& t = comm_.ledger().table(phase);
      for (int k = 0; k < kNumCommKinds; ++k) {
        if (static_cast<CommKind>(k) != CommKind::kControl) b += t[k].cross_node_bytes;
      }
    }
    return static_cast<double>(b);
  }

  uint64_t count_wrong(Op op, DType t, size_t count, const Partition& part) const {
    const int n = comm_.size();
    const int me = comm_.rank();
    auto sum_at = [&](size_t i) {
      float s = 0;
      for (int r = 0; r < n; ++r) s += element_value(r, i);
      return s;
    };
    uint64_t wrong = 0;
    switch (op) {
      case Op::kAllReduce:
        for (size_t i = 0; i < count; ++i) wrong += read_element(in_, t, i) != sum_at(i);
        break;
      case Op::kReduceScatter:
        for (size_t j = 0; j < part.count(me); ++j) {
          wrong += read_element(out_, t, j) != sum_at(part.offset(me) + j);
        }
        break;
      case Op::kAllGather:
        for (size_t i = 0; i < count; ++i) {
          wrong += read_element(out_, t, i) != element_value(part.owner(i), i);
        }
        break;
      case Op::kBroadcast:
        for (size_t i = 0; i < count; ++i) wrong += read_element(in_, t, i) != element_value(0, i);
        break;
    }
    return wrong;
  }

  Communicator& comm_;
  const Config& cfg_;
  std::vector<std::byte> in_;
  std::vector<std::byte> out_;
};

// The rows' sizes: min_bytes times each power of factor up to max_bytes, stepped so that
// the product never wraps past 64 bits.
std::vector<uint64_t> row_sizes(uint64_t min_bytes, uint64_t max_bytes, uint64_t factor) {
  std::vector<uint64_t> sizes = {min_bytes};
  while (sizes.back() <= max_bytes / factor) sizes.push_back(sizes.back() * factor);
  return sizes;
}

// Every rank of this process holds an input and an output buffer of the largest row at
// once (the local backend runs all ranks here; under MPI, one per process). Refused before
// the first allocation, naming what would fit.
void check_memory(const Config& cfg, uint64_t row, int local_ranks) {
  const auto available = available_memory();
  if (!available) return;
  const double need = 2.0 * static_cast<double>(local_ranks) * static_cast<double>(row);
  if (need <= static_cast<double>(*available)) return;
  throw OutOfMemory(fmt::format(
      "--max-bytes {}: the largest row needs {} ({} rank(s) x 2 buffers x {}), but the machine "
      "has {} available; use a smaller --max-bytes{}",
      cfg.max_bytes, format_bytes(need), local_ranks, format_bytes(static_cast<double>(row)),
      format_bytes(static_cast<double>(*available)), local_ranks > 1 ? " or fewer --ranks" : ""));
}

// memcpy bandwidth (bytes copied per second) with `threads` threads, each copying its own
// 64 MiB: the memory system's reference figure for the table's header.
double memcpy_bandwidth(int threads) {
  const size_t bytes = 64u << 20;
  std::vector<double> rates(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int k = 0; k < threads; ++k) {
    pool.emplace_back([&, k] {
      std::vector<char> a(bytes, 1), b(bytes, 0);
      std::memcpy(b.data(), a.data(), bytes);
      double best = 1e9;
      for (int rep = 0; rep < 5; ++rep) {
        const auto t0 = Clock::now();
        std::memcpy(b.data(), a.data(), bytes);
        best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
      }
      rates[k] = static_cast<double>(bytes) / best;
    });
  }
  for (auto& t : pool) t.join();
  double total = 0;
  for (double r : rates) total += r;
  return total;
}

// One row, as a table line or a JSON object.
void print_row(const Row& row, const Config& cfg, const Communicator& comm) {
  if (cfg.json) {
    nlohmann::json j = {{"op", row.op},
                        {"dtype", std::string(dtype_name(row.dtype))},
                        {"bytes", row.bytes},
                        {"time_us", row.time_us},
                        {"algbw", row.algbw},
                        {"busbw", row.busbw},
                        {"wrong", row.wrong},
                        {"ranks", comm.size()},
                        {"backend", std::string(comm.backend_name())},
                        {"iters", row.iters}};
    if (cfg.node_ranks > 0) j["host_bytes_per_s"] = row.host_rate;
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("  {:>14} {:>5} {:>12} {:>10.1f} {:>8.2f} {:>8.2f} {:>7} {:>6}{}\n", row.op,
               dtype_name(row.dtype), row.bytes, row.time_us, row.algbw, row.busbw, row.wrong,
               row.iters, cfg.node_ranks > 0 ? fmt::format(" {:>11.3f}", row.host_rate / 1e6) : "");
  }
}

// --ops as the collectives they name, in their order.
std::vector<OpInfo> chosen_ops(const std::vector<std::string>& names) {
  std::vector<OpInfo> ops;
  for (const auto& name : names) {
    auto it = std::find_if(std::begin(kOps), std::end(kOps),
                           [&](const OpInfo& o) { return name == o.name; });
    if (it == std::end(kOps)) {
      throw InvalidArgument(fmt::format(
          "--ops: '{}' is not a collective; use all_reduce, reduce_scatter, all_gather, broadcast",
          name));
    }
    ops.push_back(*it);
  }
  return ops;
}

// --dtypes as the element types they name, in their order.
std::vector<DType> chosen_dtypes(const std::vector<std::string>& names) {
  std::vector<DType> dtypes;
  for (const auto& name : names) {
    const auto t = parse_dtype(name);
    if (!t)
      throw InvalidArgument(fmt::format("--dtypes: '{}' is unknown; use f32, bf16, f16", name));
    dtypes.push_back(*t);
  }
  return dtypes;
}

// The table's header: the run, the memcpy reference figures and the columns.
void print_header(const Config& cfg, const Communicator& comm) {
  const double m1 = memcpy_bandwidth(1);
  const double m2 = memcpy_bandwidth(2);
  fmt::print("# zerodp bench-comm: backend {}, {} ranks\n", comm.backend_name(), comm.size());
  fmt::print("# memcpy reference: {:.1f} GB/s on 1 thread, {:.1f} GB/s on 2 threads\n", m1 / 1e9,
             m2 / 1e9);
  fmt::print("# {:>14} {:>5} {:>12} {:>10} {:>8} {:>8} {:>7} {:>6}{}\n", "op", "dtype", "bytes",
             "time_us", "algbw", "busbw", "#wrong", "iters",
             cfg.node_ranks > 0 ? fmt::format(" {:>11}", "host_MB/s") : "");
  std::fflush(stdout);
}

int run_bench(const Config& cfg, Launch args) {
  const Backend backend = parse_backend_flag(cfg.backend);
  const std::vector<OpInfo> ops = chosen_ops(cfg.ops);
  const std::vector<DType> dtypes = chosen_dtypes(cfg.dtypes);
  const uint64_t min_bytes = parse_bytes(cfg.min_bytes, "--min-bytes");
  const uint64_t max_bytes = parse_bytes(cfg.max_bytes, "--max-bytes");
  if (min_bytes < 4) {
    throw InvalidArgument(fmt::format(
        "--min-bytes {} is invalid; use 4 bytes or more (one f32 element)", cfg.min_bytes));
  }
  if (max_bytes < min_bytes) {
    throw InvalidArgument(fmt::format(
        "--min-bytes {} is more than --max-bytes {}; give a --min-bytes no larger than --max-bytes",
        cfg.min_bytes, cfg.max_bytes));
  }
  if (cfg.factor < 2) {
    throw InvalidArgument(fmt::format("--factor {} is invalid; use 2 or more", cfg.factor));
  }
  if (!std::isfinite(cfg.seconds_per_row) || !(cfg.seconds_per_row > 0)) {
    throw InvalidArgument(
        fmt::format("--seconds-per-row {} is invalid; use a positive number of seconds, e.g. 0.25",
                    cfg.seconds_per_row));
  }
  // Past about 9e9 s a deadline overflows the clock's nanoseconds; 1e6 s (11 days) is past
  // any wait worth timing.
  if (!(cfg.timeout > 0) || !(cfg.timeout <= kMaxTimeoutSeconds)) {
    throw InvalidArgument(
        fmt::format("--collective-timeout {} is invalid; use seconds in (0, {}], e.g. 300",
                    cfg.timeout, kMaxTimeoutSeconds));
  }
  const std::vector<uint64_t> sizes =
      row_sizes(min_bytes, max_bytes, static_cast<uint64_t>(cfg.factor));
  // launch() refuses --ranks below 1 after this.
  check_memory(
      cfg, sizes.back(),
      backend == Backend::kLocal ? std::max(cfg.ranks, 1) : std::max(cfg.ranks_per_process, 1));

  LaunchOptions opts;
  opts.backend = backend;
  // Under mpirun the job's size is the world unless --ranks was given to check it.
  opts.ranks = backend == Backend::kMpi && !cfg.ranks_given ? 0 : cfg.ranks;
  check_process_ranks(cfg.ranks_per_process, backend == Backend::kMpi, cfg.node_ranks,
                      /*processes=*/0);
  opts.ranks_per_process = cfg.ranks_per_process;
  opts.comm.timeout_seconds = cfg.timeout;
  // Under mpirun the communicator checks the world it finds.
  if (backend == Backend::kLocal) check_whole_nodes(cfg.node_ranks, cfg.ranks, WorldNamed::kRanks);
  opts.comm.node_ranks = cfg.node_ranks;

  uint64_t total_wrong = 0;
  launch(opts, args.argc, args.argv, [&](Communicator& comm) {
    const bool printer = comm.rank() == 0;
    if (printer && !cfg.json) print_header(cfg, comm);
    for (const auto& info : ops) {
      for (DType t : dtypes) {
        Bench bench(comm, cfg);
        for (uint64_t bytes : sizes) {
          const size_t count = bytes / dtype_size(t);
          const Row row = bench.run(info, t, count);
          if (!printer) continue;
          total_wrong += row.wrong;
          print_row(row, cfg, comm);
          std::fflush(stdout);
        }
      }
    }
  });
  if (total_wrong != 0) {
    fmt::print(stderr, "zerodp bench-comm: {} wrong elements\n", total_wrong);
    return kExitFailure;
  }
  return 0;
}

}  // namespace

Runner add_bench_comm(CLI::App& app) {
  auto cfg = std::make_shared<Config>();
  app.add_option("--backend", cfg->backend, "local (rank threads in this process) or mpi")
      ->capture_default_str();
  app.add_option("--ranks-per-process", cfg->ranks_per_process,
                 "mpi: ranks each process runs as threads (the world is -np x this)")
      ->capture_default_str();
  CLI::Option* ranks = app.add_option("--ranks", cfg->ranks, "Number of ranks (local backend)")
                           ->capture_default_str();
  app.add_option("--node-ranks", cfg->node_ranks,
                 "Ranks per host (consecutive ranks share one): adds host_MB/s, the bytes that "
                 "entered a host from the others per second, a host NIC's sustained rate (the "
                 "figure --inter-node-bandwidth takes; docs/cluster.md)");
  app.add_option("--ops", cfg->ops, "Collectives to time")->delimiter(',')->capture_default_str();
  app.add_option("--dtypes", cfg->dtypes, "Element types: f32, bf16, f16")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--min-bytes", cfg->min_bytes, "Smallest buffer")->capture_default_str();
  app.add_option("--max-bytes", cfg->max_bytes, "Largest buffer")->capture_default_str();
  app.add_option("--factor", cfg->factor, "Size multiplier between rows")->capture_default_str();
  app.add_option("--seconds-per-row", cfg->seconds_per_row, "Timing budget per row")
      ->capture_default_str();
  app.add_option("--collective-timeout", cfg->timeout, "Seconds before a collective fails")
      ->capture_default_str();
  app.add_flag("--json", cfg->json, "One JSON object per row on stdout");
  return [cfg, ranks](Launch launch) {
    cfg->ranks_given = ranks->count() > 0;
    return run_bench(*cfg, launch);
  };
}

}  // namespace zerodp::cli
