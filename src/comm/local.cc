#include "comm/local.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <fstream>
#include <limits>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include <fmt/core.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/quantize.h"
#include "comm/reduce.h"
#include "comm/thread_group.h"
#include "core/error.h"

namespace zerodp {
namespace {

// What a collective is, so ranks can check they are all in the same one.
struct Fingerprint {
  CommKind kind = CommKind::kControl;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = -1;
  size_t count = 0;
  bool operator==(const Fingerprint&) const = default;
};

std::string describe(const Fingerprint& f) {
  std::string s = fmt::format("{}({} x {}", comm_kind_name(f.kind), f.count, dtype_name(f.dtype));
  if (f.kind == CommKind::kReduceScatter) s += fmt::format(", {}", reduce_op_name(f.op));
  if (f.kind == CommKind::kBroadcast) s += fmt::format(", root {}", f.root);
  if (f.root == -2) s += ", inside each node";
  return s + ")";
}

}  // namespace

// State shared by the ranks of one local world: the abort record and barrier (ThreadGroup),
// and one rendezvous slot per rank where it publishes the buffers of its current collective.
struct LocalWorld::Shared {
  struct alignas(64) Slot {
    const void* in = nullptr;
    void* out = nullptr;
    Fingerprint fingerprint;
  };

  Shared(int n, const CommOptions& opt)
      : world(n), options(opt), slots(static_cast<size_t>(n)), group(n, 0, opt.timeout_seconds) {}

  const int world;
  const CommOptions options;
  std::vector<Slot> slots;
  ThreadGroup group;
};

namespace {

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(int rank, std::shared_ptr<LocalWorld::Shared> shared)
      : Communicator(rank, shared->world, shared->options), shared_(std::move(shared)) {
    watch_abort_flag(&shared_->group.aborted_flag());
  }
  ~LocalCommunicator() override { stop_worker(); }

  std::string_view backend_name() const override { return "local"; }

  void abort(const std::string& reason) noexcept override {
    try {
      shared_->group.abort(rank(), reason);
    } catch (...) {
      // Aborting must not fail; the peers then fail by their timeout instead.
    }
  }

 protected:
  void run_reduce_scatter(ConstBuffer in, MutableBuffer out, const Partition& part,
                          ReduceOp op) override {
    const Fingerprint f{CommKind::kReduceScatter, in.dtype, op, -1, in.count};
    publish(f, in.data, out.data);
    const size_t w = dtype_size(in.dtype);
    const size_t offset_bytes = part.offset(rank()) * w;
    std::vector<const void*> inputs(static_cast<size_t>(size()));
    for (int k = 0; k < size(); ++k) {
      inputs[k] = static_cast<const char*>(shared_->slots[k].in) + offset_bytes;
    }
    if (quantized_reduce_scatter()) {
      reduce_quantized(inputs, out, in.dtype, op);
    } else if (two_level()) {
      reduce_two_level(inputs, out, in.dtype, op);
    } else {
      reduce_rank_order(inputs, out.data, out.count, in.dtype, op);
    }
    depart(f);
  }

  void run_all_gather(ConstBuffer shard, MutableBuffer out, const Partition& part) override {
    const Fingerprint f{CommKind::kAllGather, out.dtype, ReduceOp::kSum, -1, out.count};
    publish(f, shard.data, out.data);
    const size_t w = dtype_size(out.dtype);
    for (int k = 0; k < size(); ++k) {
      void* dst = static_cast<char*>(out.data) + part.offset(k) * w;
      const void* src = shared_->slots[k].in;
      if (dst != src && part.count(k) > 0) std::memcpy(dst, src, part.count(k) * w);
    }
    depart(f);
  }

  void run_node_all_gather(ConstBuffer shard, MutableBuffer out,
                           const Partition& node_part) override {
    // Root -2 tells this gather from a world all-gather of the same count.
    const Fingerprint f{CommKind::kAllGather, out.dtype, ReduceOp::kSum, -2, out.count};
    publish(f, shard.data, out.data);
    const size_t w = dtype_size(out.dtype);
    const int first = node_first();
    for (int l = 0; l < node_part.world_size(); ++l) {
      void* dst = static_cast<char*>(out.data) + node_part.offset(l) * w;
      const void* src = shared_->slots[first + l].in;
      if (dst != src && node_part.count(l) > 0) std::memcpy(dst, src, node_part.count(l) * w);
    }
    depart(f);
  }

  void run_node_reduce_scatter(ConstBuffer in, MutableBuffer out, const Partition& node_part,
                               ReduceOp op) override {
    // Root -2 tells it from a world reduce-scatter of the same count.
    const Fingerprint f{CommKind::kReduceScatter, in.dtype, op, -2, in.count};
    publish(f, in.data, out.data);
    const size_t offset_bytes = node_part.offset(rank() % node_ranks()) * dtype_size(in.dtype);
    std::vector<const void*> inputs(static_cast<size_t>(size()));
    for (int k = 0; k < size(); ++k) {
      inputs[k] = static_cast<const char*>(shared_->slots[k].in) + offset_bytes;
    }
    if (size() == node_ranks()) {
      reduce_rank_order(inputs, out.data, out.count, in.dtype, op);
      depart(f);
      return;
    }
    // Over several nodes the other nodes' ranks of this local index read this rank's range
    // too, which may be the output (in place): reduce into scratch, write once all have read.
    const size_t bytes = out.bytes();
    result_.resize(bytes);
    const MutableBuffer scratch(result_.data(), out.count, out.dtype);
    if (nodes_fold_in_two_levels()) {
      reduce_two_level(inputs, scratch, in.dtype, op);
    } else {
      reduce_rank_order(inputs, scratch.data, out.count, in.dtype, op);
    }
    shared_->group.arrive_and_wait(rank(), fmt::format("{} #{} (read)", describe(f), sequence_));
    if (bytes > 0) std::memcpy(out.data, result_.data(), bytes);
    depart(f);
  }

  void run_broadcast(MutableBuffer buf, int root) override {
    const Fingerprint f{CommKind::kBroadcast, buf.dtype, ReduceOp::kSum, root, buf.count};
    publish(f, buf.data, buf.data);
    if (rank() != root && buf.count > 0)
      std::memcpy(buf.data, shared_->slots[root].in, buf.bytes());
    depart(f);
  }

  void run_gather_control(std::span<const double> mine, std::span<double> all) override {
    const Fingerprint f{CommKind::kControl, DType::kF32, ReduceOp::kSum, -1, mine.size()};
    publish(f, mine.data(), all.data());
    for (int k = 0; k < size(); ++k) {
      const auto* src = static_cast<const double*>(shared_->slots[k].in);
      std::copy(src, src + mine.size(), all.begin() + static_cast<std::ptrdiff_t>(k * mine.size()));
    }
    depart(f);
  }

 private:
  // Makes this rank's buffers visible and waits for every peer to do the same; then checks
  // that all ranks are in the same collective, since reading a peer's buffer with another
  // length or dtype would be undefined behaviour, not merely a wrong result.
  void publish(const Fingerprint& f, const void* in, void* out) {
    ++sequence_;
    auto& slot = shared_->slots[rank()];
    slot.in = in;
    slot.out = out;
    slot.fingerprint = f;
    shared_->group.arrive_and_wait(rank(), fmt::format("{} #{}", describe(f), sequence_));
    for (int k = 0; k < size(); ++k) {
      const Fingerprint& other = shared_->slots[k].fingerprint;
      if (!(other == f)) {
        const std::string reason =
            fmt::format("collective mismatch at call #{}: rank {} called {}, rank {} called {}",
                        sequence_, rank(), describe(f), k, describe(other));
        shared_->group.abort(std::min(rank(), k), reason);
        throw CommError(reason, k);
      }
    }
  }

  // The two-level order (CommOptions::two_level) over this rank's range: each node's
  // partial folded from its ranks' inputs and rounded to the dtype, then the partials folded
  // in node order. Computed here from the peers' inputs directly, in pieces of kPiece
  // elements so the partials' scratch stays small; the bits are those of the exchange the
  // mpi backend runs, which computes the same partials on the ranks of each node.
  void reduce_two_level(std::span<const void* const> inputs, MutableBuffer out, DType dtype,
                        ReduceOp op) {
    constexpr size_t kPiece = 16384;
    const int t = node_ranks();
    const int p = size() / t;
    const size_t w = dtype_size(dtype);
    const size_t out_w = dtype_size(out.dtype);
    const size_t piece = std::min(kPiece, out.count);
    partials_.resize(static_cast<size_t>(p) * piece * w);
    std::vector<const void*> node_inputs(static_cast<size_t>(t));
    std::vector<const void*> partials(static_cast<size_t>(p));
    for (size_t begin = 0; begin < out.count; begin += piece) {
      const size_t n = std::min(piece, out.count - begin);
      for (int q = 0; q < p; ++q) {
        for (int l = 0; l < t; ++l) {
          node_inputs[l] = static_cast<const char*>(inputs[q * t + l]) + begin * w;
        }
        void* partial = partials_.data() + static_cast<size_t>(q) * piece * w;
        reduce_rank_order(node_inputs, partial, n, dtype, node_partial_op(op));
        partials[q] = partial;
      }
      reduce_rank_order(partials, static_cast<char*>(out.data) + begin * out_w, n, dtype, op,
                        size());
    }
  }

  // qgZ (CommOptions::qgz_bits) over this rank's range, computed from the peers' inputs: each
  // quantized here as its owner would quantize it before sending, so the bits are those of
  // the exchange (the mpi backend's).
  void reduce_quantized(std::span<const void* const> inputs, MutableBuffer out, DType dtype,
                        ReduceOp op) {
    const BlockQuant q = qgz_quant(options());
    const int t = node_ranks();
    const int nodes = size() / t;
    const int node = rank() / t;
    const int local = rank() % t;
    const size_t n = out.count;
    partial_.assign(n, 0.0f);
    total_.assign(n, 0.0f);
    if (op == ReduceOp::kSumInto && n > 0) {
      std::memcpy(total_.data(), out.data, n * sizeof(float));
    }
    packed_.resize(quantized_bytes(n, q));
    for (int p = 0; p < nodes; ++p) {
      // Node p's partial, as rank (p, local) folds it.
      std::fill(partial_.begin(), partial_.end(), 0.0f);
      for (int l = 0; l < t; ++l) {
        const ConstBuffer x(inputs[p * t + l], n, dtype);
        if (l == local) {
          add_widened(x, partial_);
        } else {
          quantize(x, packed_, q);
          dequantize_add(packed_, partial_, q);
        }
      }
      if (p == node) {
        for (size_t i = 0; i < n; ++i) total_[i] += partial_[i];
      } else {
        quantize(ConstBuffer(std::span<const float>(partial_)), packed_, q);
        dequantize_add(packed_, total_, q);
      }
    }
    finish_sum(total_, out, op, size());
  }

  // Waits until every peer is done reading this rank's buffers, so the caller may reuse them.
  void depart(const Fingerprint& f) {
    shared_->group.arrive_and_wait(rank(),
                                   fmt::format("{} #{} (completion)", describe(f), sequence_));
  }

  std::shared_ptr<LocalWorld::Shared> shared_;
  uint64_t sequence_ = 0;
  std::vector<std::byte> partials_;     // two-level: the P node partials of a piece
  std::vector<float> partial_, total_;  // qgZ: a node's partial, and the sum so far
  std::vector<std::byte> packed_;       // qgZ: one quantized range
  std::vector<std::byte> result_;       // node_reduce_scatter over nodes, until all have read
};

}  // namespace

LocalWorld::LocalWorld(int world_size, const CommOptions& options) {
  if (world_size < 1) {
    throw InvalidArgument(
        fmt::format("local backend: world size {} is invalid; use 1 or more ranks", world_size));
  }
  if (!(options.timeout_seconds > 0)) {
    throw InvalidArgument(fmt::format(
        "collective timeout {} s is invalid; use a positive number of seconds (default 300)",
        options.timeout_seconds));
  }
  shared_ = std::make_shared<Shared>(world_size, options);
  for (int r = 0; r < world_size; ++r) {
    comms_.push_back(std::make_unique<LocalCommunicator>(r, shared_));
  }
}

LocalWorld::~LocalWorld() = default;

int LocalWorld::failed_rank() const { return shared_->group.failed_rank(); }

int LocalWorld::size() const { return shared_->world; }

Communicator& LocalWorld::comm(int rank) {
  if (rank < 0 || rank >= size()) {
    throw InvalidArgument(
        fmt::format("local backend: rank {} is outside the world of {} ranks", rank, size()));
  }
  return *comms_[rank];
}

namespace {

uint64_t read_number(const char* path) {
  std::ifstream in(path);
  uint64_t v = 0;
  return in >> v ? v : std::numeric_limits<uint64_t>::max();
}

// Threads this process may still start: the tightest of the kernel's limits (threads, pids,
// memory maps at two per thread stack, the user's process limit) less what already runs
// on the machine (the total in /proc/loadavg).
uint64_t startable_threads() {
  uint64_t limit = std::min({read_number("/proc/sys/kernel/threads-max"),
                             read_number("/proc/sys/kernel/pid_max"),
                             read_number("/proc/sys/vm/max_map_count") / 2});
  rlimit nproc{};
  if (::getrlimit(RLIMIT_NPROC, &nproc) == 0 && nproc.rlim_cur != RLIM_INFINITY) {
    limit = std::min<uint64_t>(limit, nproc.rlim_cur);
  }
  std::ifstream in("/proc/loadavg");
  double a = 0, b = 0, c = 0;
  char sep = 0;
  uint64_t running = 0, total = 0;
  if (in >> a >> b >> c >> running >> sep >> total && total < limit) return limit - total;
  return limit;
}

}  // namespace

void check_startable_threads(int world_size) {
  const uint64_t startable = startable_threads();
  if (world_size > 0 && static_cast<uint64_t>(world_size) > startable) {
    throw InvalidArgument(fmt::format(
        "--ranks {} needs {} threads, but this machine lets the process start about {} more; "
        "use fewer local ranks, or --backend mpi across machines",
        world_size, world_size, startable));
  }
}

void run_local(int world_size, const CommOptions& options,
               const std::function<void(Communicator&)>& fn) {
  // Checked before the first thread starts: failing at the 30,000th would leave the
  // others waiting for ranks that never come.
  check_startable_threads(world_size);
  LocalWorld world(world_size, options);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world_size));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    try {
      threads.emplace_back([&, r] {
        Communicator& comm = world.comm(r);
        try {
          fn(comm);
        } catch (const std::exception& e) {
          errors[r] = std::current_exception();
          comm.abort(e.what());
        } catch (...) {
          errors[r] = std::current_exception();
          comm.abort("unknown exception");
        }
      });
    } catch (const std::system_error& e) {
      // The machine refused a thread after all: the started ranks must not wait for it.
      world.comm(0).abort(fmt::format("rank {} could not start: {}", r, e.what()));
      for (auto& t : threads) t.join();
      throw Error(
          fmt::format("--ranks {}: the machine refused the thread of rank {} ({}); use "
                      "fewer local ranks",
                      world_size, r, e.what()));
    }
  }
  for (auto& t : threads) t.join();
  // A timeout is best told by the rank that waited: the rank it names did not fail, it
  // was late, and its own error only repeats the abort record.
  for (const auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const CommTimeout&) {
      throw;
    } catch (...) {
    }
  }
  // Otherwise the root cause is the failure of the rank the abort record names; the others'
  // errors are consequences.
  const int culprit = world.failed_rank();
  if (culprit >= 0 && errors[culprit]) std::rethrow_exception(errors[culprit]);
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace zerodp
