#include "comm/communicator.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <exception>
#include <thread>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "comm/quantize.h"
#include "comm/world_shape.h"
#include "core/error.h"
#include "core/mutex.h"
#include "core/stop_flag.h"
#include "core/units.h"

namespace zerodp {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kSumInto:
      return "sum_into";
  }
  return "unknown";
}

struct Work::State {
  Mutex mu;
  CondVar cv;
  bool done GUARDED_BY(mu) = false;
  std::exception_ptr error GUARDED_BY(mu);
};

void Work::wait() {
  if (!state_) return;
  MutexLock lock(state_->mu);
  while (!state_->done) state_->cv.wait(state_->mu);
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Work::ready() const {
  if (!state_) return true;
  MutexLock lock(state_->mu);
  return state_->done;
}

// Runs a rank's collectives one at a time, in issue order, on its own thread, so that
// compute can go on while they progress. A failed collective poisons the worker: every
// later one fails with the same error without running, since peers can no longer be in step.
class Communicator::Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() { stop(); }

  void push(std::function<void()> op, std::shared_ptr<Work::State> state, double min_seconds,
            std::exception_ptr too_slow, CommKind kind, uint64_t bytes) {
    {
      MutexLock lock(mu_);
      queue_.push_back(
          {std::move(op), std::move(state), min_seconds, std::move(too_slow), kind, bytes});
    }
    cv_.notify_one();
  }

  void stop() {
    {
      MutexLock lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Item {
    std::function<void()> op;
    std::shared_ptr<Work::State> state;
    double min_seconds = 0;  // simulated link: the collective lasts at least this long
    // Set when min_seconds is past the collective timeout: the error the collective ends
    // with once its data has moved, instead of the wait.
    std::exception_ptr too_slow;
    CommKind kind = CommKind::kControl;
    uint64_t bytes = 0;
  };

 public:
  // Both set before the first collective is pushed (which orders them before their reads).
  Communicator::TraceHook hook;
  const std::atomic<bool>* abort_flag = nullptr;
  std::function<void()> on_failure;  // Communicator::collective_failed

 private:
  // Waits until `seconds` after `start`, or less: a requested stop ends the wait (the run
  // finishes its step at full speed, saves and exits instead of waiting out a slow link), as
  // do a recorded failure (the next collective fails anyway) and stop(). The stop request is
  // set by a signal handler, which may only store to a lock-free atomic and cannot notify a
  // condition variable, and the abort record belongs to the backend, so both are polled:
  // slices of kSlice bound how late a stop is seen, at a hundred wake-ups a second of a
  // thread that has nothing else to do. stop() notifies cv_ and ends the wait at once. The
  // time left is computed in double seconds and only a slice is ever converted to the
  // clock's integer nanoseconds, so no duration, however long, overflows.
  void simulate_link(std::chrono::steady_clock::time_point start, double seconds) {
    constexpr double kSlice = 0.01;
    MutexLock lock(mu_);
    for (;;) {
      if (stopping_ || stop_requested() != 0 || (abort_flag != nullptr && abort_flag->load())) {
        return;
      }
      const double left =
          seconds - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!(left > 0)) return;
      cv_.wait_for(mu_, std::chrono::duration<double>(std::min(left, kSlice)));
    }
  }

  void loop() {
    std::exception_ptr poisoned;
    for (;;) {
      Item item;
      {
        MutexLock lock(mu_);
        while (!stopping_ && queue_.empty()) cv_.wait(mu_);
        if (queue_.empty()) return;  // stopping, and nothing left to finish
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr error = poisoned;
      if (!error) {
        const auto start = std::chrono::steady_clock::now();
        try {
          item.op();
        } catch (...) {
          error = std::current_exception();
          if (on_failure) on_failure();
        }
        // After the op, not instead of it: the peers are in this collective too and must
        // not wait at its rendezvous for a rank that already gave up.
        if (!error && item.too_slow) error = item.too_slow;
        if (error) poisoned = error;
        if (!error && item.min_seconds > 0) simulate_link(start, item.min_seconds);
        if (!error && hook) hook(item.kind, item.bytes, start, std::chrono::steady_clock::now());
      }
      {
        MutexLock lock(item.state->mu);
        item.state->done = true;
        item.state->error = error;
      }
      item.state->cv.notify_all();
    }
  }

  Mutex mu_;
  CondVar cv_;
  std::deque<Item> queue_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the members above exist
};

Communicator::Communicator(int rank, int size, const CommOptions& options)
    : rank_(rank), size_(size), options_(options), worker_(std::make_unique<Worker>()) {
  worker_->on_failure = [this] { collective_failed(); };
  if (options.qgz_bits != 0 && options.qgz_bits != 4 && options.qgz_bits != 8) {
    throw InvalidArgument(fmt::format("qgZ: {} bits is not a quantization; use 8 or 4 (or 0: off)",
                                      options.qgz_bits));
  }
  if (options.qgz_bits != 0) check_block_quant(qgz_quant(options));
  check_whole_nodes(options.node_ranks, size, WorldNamed::kLaunched);
}

size_t Communicator::node_count(const Partition& part) const {
  const int first = node_first();
  const int end = first + node_ranks();
  return (end < size_ ? part.offset(end) : part.length()) - part.offset(first);
}

size_t Communicator::column_count(const Partition& part) const {
  const int t = node_ranks();
  size_t n = 0;
  for (int r = rank_ % t; r < size_; r += t) n += part.count(r);
  return n;
}

LinkModel Communicator::link_model() const {
  return LinkModel{.bandwidth = options_.link_bandwidth,
                   .latency = options_.link_latency,
                   .inter_bandwidth = options_.inter_node_bandwidth,
                   .inter_latency = options_.inter_node_latency,
                   .nic_ranks = static_cast<double>(node_ranks())};
}

double Communicator::two_level_seconds(uint64_t intra, uint64_t cross) const {
  const int t = node_ranks();
  return link_model().two_level_seconds(static_cast<double>(intra), t - 1,
                                        static_cast<double>(cross), size_ / t - 1);
}

Communicator::Traffic Communicator::reduce_scatter_traffic(const Partition& part, size_t w) const {
  const uint64_t mine = part.count(rank_);
  if (options_.qgz_bits != 0) {
    const BlockQuant q = qgz_quant(options_);
    const int t = node_ranks();
    uint64_t column = 0;
    for (int r = rank_ % t; r < size_; r += t) column += quantized_bytes(part.count(r), q);
    const uint64_t intra = static_cast<uint64_t>(t - 1) * column;
    const uint64_t cross = static_cast<uint64_t>(size_ / t - 1) * quantized_bytes(mine, q);
    return {intra + cross, cross, two_level_seconds(intra, cross)};
  }
  if (two_level()) {
    const uint64_t intra = static_cast<uint64_t>(node_ranks() - 1) * column_count(part) * w;
    const uint64_t cross = static_cast<uint64_t>(size_ / node_ranks() - 1) * mine * w;
    return {intra + cross, cross, two_level_seconds(intra, cross)};
  }
  const uint64_t bytes = static_cast<uint64_t>(size_ - 1) * mine * w;
  const uint64_t cross = static_cast<uint64_t>(size_ - node_ranks()) * mine * w;
  return {bytes, cross, link_seconds(bytes, cross, size_ - 1)};
}

Communicator::Traffic Communicator::all_gather_traffic(const Partition& part, size_t w) const {
  const uint64_t bytes = (part.length() - part.count(rank_)) * w;
  if (two_level()) {
    const uint64_t cross = (column_count(part) - part.count(rank_)) * w;
    return {bytes, cross, two_level_seconds(bytes - cross, cross)};
  }
  const uint64_t cross = (part.length() - node_count(part)) * w;
  return {bytes, cross, link_seconds(bytes, cross, size_ - 1)};
}

double Communicator::link_seconds(uint64_t bytes, uint64_t cross, int steps) const {
  return link_model().flat_seconds(static_cast<double>(bytes), static_cast<double>(cross), steps,
                                   node_ranks() < size_);
}

Communicator::~Communicator() { stop_worker(); }

void Communicator::stop_worker() {
  if (worker_) worker_->stop();
}

void Communicator::set_trace_hook(TraceHook hook) { worker_->hook = std::move(hook); }

void Communicator::watch_abort_flag(const std::atomic<bool>* flag) { worker_->abort_flag = flag; }

std::string Communicator::link_settings() const {
  std::vector<std::string> parts;
  if (options_.link_bandwidth > 0) {
    parts.push_back(fmt::format("--link-bandwidth {}", format_bandwidth(options_.link_bandwidth)));
  }
  if (options_.link_latency > 0) {
    parts.push_back(fmt::format("--link-latency {}", format_seconds(options_.link_latency)));
  }
  if (node_ranks() < size_ && options_.inter_node_bandwidth > 0) {
    parts.push_back(
        fmt::format("--inter-node-bandwidth {}", format_bandwidth(options_.inter_node_bandwidth)));
  }
  if (node_ranks() < size_ && options_.inter_node_latency > 0) {
    parts.push_back(
        fmt::format("--inter-node-latency {}", format_seconds(options_.inter_node_latency)));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

Work Communicator::submit(std::function<void()> op, CommKind kind, uint64_t bytes,
                          double min_seconds) {
  auto state = std::make_shared<Work::State>();
  // Decided here, where the options are, and thrown by the worker through Work::wait() like
  // every other failure of a collective. `!(<=)` also takes an infinite time.
  std::exception_ptr too_slow;
  if (min_seconds > 0 && !(min_seconds <= options_.timeout_seconds)) {
    too_slow = std::make_exception_ptr(CommTimeout(
        fmt::format("{} on rank {}: the simulated link ({}) makes it last {} ({} received), "
                    "longer than the collective timeout of {}; use a faster simulated link or a "
                    "longer --collective-timeout",
                    comm_kind_name(kind), rank_, link_settings(), format_seconds(min_seconds),
                    format_bytes(static_cast<double>(bytes)),
                    format_seconds(options_.timeout_seconds)),
        -1));
  }
  worker_->push(std::move(op), state, min_seconds, std::move(too_slow), kind, bytes);
  return Work(state);
}

namespace {

const char* byte_ptr(const void* p) { return static_cast<const char*>(p); }

// True when [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  return byte_ptr(a) < byte_ptr(b) + b_bytes && byte_ptr(b) < byte_ptr(a) + a_bytes;
}

void check_partition(std::string_view op, const Partition& part, int rank, int size) {
  if (part.world_size() != size) {
    throw InvalidArgument(fmt::format("{}: partition has {} ranges but the world has {} ranks", op,
                                      part.world_size(), size));
  }
  (void)rank;
}

void check_dtypes(std::string_view op, DType a, DType b) {
  if (a != b) {
    throw InvalidArgument(fmt::format("{}: input is {} but output is {}; both must have one dtype",
                                      op, dtype_name(a), dtype_name(b)));
  }
}

}  // namespace

Work Communicator::reduce_scatter_async(ConstBuffer in, MutableBuffer out, const Partition& part,
                                        ReduceOp op) {
  constexpr std::string_view kOp = "reduce_scatter";
  check_partition(kOp, part, rank_, size_);
  const bool into = op == ReduceOp::kSumInto;
  if (into && out.dtype != DType::kF32) {
    throw InvalidArgument(fmt::format(
        "{}: sum_into adds into an fp32 accumulator, but the output is {}; pass an f32 buffer", kOp,
        dtype_name(out.dtype)));
  }
  if (!into) check_dtypes(kOp, in.dtype, out.dtype);
  if (in.dtype == DType::kU8) {
    throw InvalidArgument(fmt::format(
        "{}: u8 buffers hold raw bytes, which all_gather and broadcast move but nothing "
        "reduces; reduce f32, f16 or bf16",
        kOp));
  }
  if (in.count != part.length()) {
    throw InvalidArgument(fmt::format("{}: input holds {} elements, partition covers {} (world {})",
                                      kOp, in.count, part.length(), size_));
  }
  const size_t mine = part.count(rank_);
  if (out.count != mine) {
    throw InvalidArgument(
        fmt::format("{}: output holds {} elements, rank {} owns {} of {} (world {})", kOp,
                    out.count, rank_, mine, part.length(), size_));
  }
  const size_t w = dtype_size(in.dtype);
  const void* own_range = byte_ptr(in.data) + part.offset(rank_) * w;
  if (into && overlaps(in.data, in.bytes(), out.data, out.bytes())) {
    throw InvalidArgument(
        fmt::format("{}: the sum_into accumulator overlaps the input on rank {}; it must be a "
                    "buffer of its own",
                    kOp, rank_));
  }
  if (!into && out.data != own_range && overlaps(in.data, in.bytes(), out.data, out.bytes())) {
    throw InvalidArgument(fmt::format(
        "{}: output overlaps the input but is not rank {}'s range of it; use that range or "
        "a separate buffer",
        kOp, rank_));
  }
  if (options_.qgz_bits != 0 && op == ReduceOp::kMax) {
    throw InvalidArgument(
        "reduce_scatter: qgZ quantizes sums; max is not one (use sum, avg or sum_into, or turn "
        "qgZ off)");
  }
  const Traffic t = reduce_scatter_traffic(part, w);
  counts_->record(CommKind::kReduceScatter, t.bytes, t.cross);
  return submit([=, this] { run_reduce_scatter(in, out, part, op); }, CommKind::kReduceScatter,
                t.bytes, t.seconds);
}

Work Communicator::all_gather_async(ConstBuffer shard, MutableBuffer out, const Partition& part) {
  constexpr std::string_view kOp = "all_gather";
  check_partition(kOp, part, rank_, size_);
  check_dtypes(kOp, shard.dtype, out.dtype);
  const size_t mine = part.count(rank_);
  if (shard.count != mine) {
    throw InvalidArgument(
        fmt::format("{}: shard holds {} elements, rank {} owns {} of {} (world {})", kOp,
                    shard.count, rank_, mine, part.length(), size_));
  }
  if (out.count != part.length()) {
    throw InvalidArgument(
        fmt::format("{}: output holds {} elements, partition covers {} (world {})", kOp, out.count,
                    part.length(), size_));
  }
  const size_t w = dtype_size(out.dtype);
  const void* own_range = byte_ptr(out.data) + part.offset(rank_) * w;
  if (shard.data != own_range && overlaps(shard.data, shard.bytes(), out.data, out.bytes())) {
    throw InvalidArgument(fmt::format(
        "{}: shard overlaps the output but is not rank {}'s range of it; use that range or a "
        "separate buffer",
        kOp, rank_));
  }
  const Traffic t = all_gather_traffic(part, w);
  counts_->record(CommKind::kAllGather, t.bytes, t.cross);
  return submit([=, this] { run_all_gather(shard, out, part); }, CommKind::kAllGather, t.bytes,
                t.seconds);
}

Work Communicator::node_all_gather_async(ConstBuffer shard, MutableBuffer out,
                                         const Partition& node_part) {
  constexpr std::string_view kOp = "node_all_gather";
  const int t = node_ranks();
  if (node_part.world_size() != t) {
    throw InvalidArgument(fmt::format("{}: partition has {} ranges but a node has {} ranks", kOp,
                                      node_part.world_size(), t));
  }
  check_dtypes(kOp, shard.dtype, out.dtype);
  const int local = rank_ - node_first();
  const size_t mine = node_part.count(local);
  if (shard.count != mine || out.count != node_part.length()) {
    throw InvalidArgument(fmt::format(
        "{}: shard holds {} and output {} elements; local rank {} of a node of {} owns {} of {}",
        kOp, shard.count, out.count, local, t, mine, node_part.length()));
  }
  const size_t w = dtype_size(out.dtype);
  const void* own_range = byte_ptr(out.data) + node_part.offset(local) * w;
  if (shard.data != own_range && overlaps(shard.data, shard.bytes(), out.data, out.bytes())) {
    throw InvalidArgument(fmt::format(
        "{}: shard overlaps the output but is not local rank {}'s range of it; use that range "
        "or a separate buffer",
        kOp, local));
  }
  const uint64_t bytes = (node_part.length() - mine) * w;
  counts_->record(CommKind::kAllGather, bytes, 0);
  const double seconds = link_model().inside_seconds(static_cast<double>(bytes), t - 1);
  return submit([=, this] { run_node_all_gather(shard, out, node_part); }, CommKind::kAllGather,
                bytes, seconds);
}

Work Communicator::node_reduce_scatter_async(ConstBuffer in, MutableBuffer out,
                                             const Partition& node_part, ReduceOp op) {
  constexpr std::string_view kOp = "node_reduce_scatter";
  const int t = node_ranks();
  const int p = size_ / t;
  if (node_part.world_size() != t) {
    throw InvalidArgument(fmt::format("{}: partition has {} ranges but a node has {} ranks", kOp,
                                      node_part.world_size(), t));
  }
  if (op != ReduceOp::kSum && op != ReduceOp::kAvg) {
    throw InvalidArgument(
        fmt::format("{}: {} is not supported; use sum or avg", kOp, reduce_op_name(op)));
  }
  if (options_.qgz_bits != 0) {
    throw InvalidArgument(fmt::format("{}: qgZ does not quantize it; turn qgZ off", kOp));
  }
  check_dtypes(kOp, in.dtype, out.dtype);
  if (in.dtype == DType::kU8) {
    throw InvalidArgument(fmt::format(
        "{}: u8 buffers hold raw bytes, which nothing reduces; reduce f32, f16 or bf16", kOp));
  }
  const int local = rank_ - node_first();
  const size_t mine = node_part.count(local);
  if (in.count != node_part.length() || out.count != mine) {
    throw InvalidArgument(fmt::format(
        "{}: input holds {} and output {} elements; local rank {} of a node of {} owns {} of {}",
        kOp, in.count, out.count, local, t, mine, node_part.length()));
  }
  const size_t w = dtype_size(in.dtype);
  const void* own_range = byte_ptr(in.data) + node_part.offset(local) * w;
  if (out.data != own_range && overlaps(in.data, in.bytes(), out.data, out.bytes())) {
    throw InvalidArgument(fmt::format(
        "{}: output overlaps the input but is not local rank {}'s range of it; use that range "
        "or a separate buffer",
        kOp, local));
  }
  const uint64_t intra = static_cast<uint64_t>(t - 1) * mine * w;
  const Partition pieces(mine, p);
  const uint64_t piece = pieces.count(rank_ / t);
  const uint64_t cross = (static_cast<uint64_t>(p - 1) * piece + mine - piece) * w;
  counts_->record(CommKind::kReduceScatter, intra + cross, cross);
  return submit([=, this] { run_node_reduce_scatter(in, out, node_part, op); },
                CommKind::kReduceScatter, intra + cross, two_level_seconds(intra, cross));
}

Work Communicator::all_reduce_async(MutableBuffer buf, ReduceOp op) {
  if (op == ReduceOp::kSumInto) {
    throw InvalidArgument(
        "all_reduce: sum_into accumulates into a separate fp32 buffer, which an in-place "
        "all-reduce does not have; use reduce_scatter with sum_into, or sum, avg or max");
  }
  if (options_.qgz_bits != 0 && op == ReduceOp::kMax) {
    throw InvalidArgument(
        "all_reduce: qgZ quantizes sums; max is not one (use sum or avg, or turn qgZ off)");
  }
  if (buf.dtype == DType::kU8) {
    throw InvalidArgument(
        "all_reduce: u8 buffers hold raw bytes, which all_gather and broadcast move but nothing "
        "reduces; reduce f32, f16 or bf16");
  }
  const Partition part(buf.count, size_);
  const size_t w = dtype_size(buf.dtype);
  const size_t mine = part.count(rank_);
  const Traffic rs = reduce_scatter_traffic(part, w);
  const Traffic ag = all_gather_traffic(part, w);
  const uint64_t bytes = rs.bytes + ag.bytes;
  counts_->record(CommKind::kAllReduce, bytes, rs.cross + ag.cross);
  return submit(
      [=, this] {
        MutableBuffer shard(static_cast<char*>(buf.data) + part.offset(rank_) * w, mine, buf.dtype);
        run_reduce_scatter(buf, shard, part, op);
        run_all_gather(shard, buf, part);
      },
      CommKind::kAllReduce, bytes,
      two_level() || quantized_reduce_scatter()
          ? rs.seconds + ag.seconds
          : link_seconds(bytes, rs.cross + ag.cross, 2 * (size_ - 1)));
}

Work Communicator::broadcast_async(MutableBuffer buf, int root) {
  if (root < 0 || root >= size_) {
    throw InvalidArgument(
        fmt::format("broadcast: root {} is outside the world of {} ranks", root, size_));
  }
  // Every rank waits for the whole transfer, the root included.
  const bool root_elsewhere = root < node_first() || root >= node_first() + node_ranks();
  const uint64_t cross = root_elsewhere ? buf.bytes() : 0;
  counts_->record(CommKind::kBroadcast, rank_ == root ? 0 : buf.bytes(), cross);
  return submit([=, this] { run_broadcast(buf, root); }, CommKind::kBroadcast,
                rank_ == root ? 0 : buf.bytes(), link_seconds(buf.bytes(), cross, size_ - 1));
}

std::vector<double> Communicator::gather_control(std::span<const double> mine) {
  std::vector<double> all(mine.size() * static_cast<size_t>(size_));
  counts_->record(CommKind::kControl,
                  static_cast<uint64_t>(size_ - 1) * mine.size() * sizeof(double),
                  static_cast<uint64_t>(size_ - node_ranks()) * mine.size() * sizeof(double));
  submit([&, this] { run_gather_control(mine, all); }, CommKind::kControl,
         static_cast<uint64_t>(size_ - 1) * mine.size() * sizeof(double))
      .wait();
  return all;
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, const CommOptions& options) {
  // Ints are exact in a double, so the control gather carries them as they are.
  const double mine[2] = {static_cast<double>(color), static_cast<double>(key)};
  const std::vector<double> all = gather_control(mine);
  std::vector<int> members;
  for (int r = 0; r < size_; ++r) {
    if (all[2 * static_cast<size_t>(r)] == mine[0]) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return all[2 * static_cast<size_t>(a) + 1] < all[2 * static_cast<size_t>(b) + 1];
  });
  const auto at = std::find(members.begin(), members.end(), rank_);
  return make_group(splits_++, members, static_cast<int>(at - members.begin()), options);
}

void Communicator::barrier() {
  const double token = 0;
  (void)gather_control(std::span<const double>(&token, 1));
}

std::vector<double> Communicator::sum_control(std::span<const double> mine) {
  const std::vector<double> all = gather_control(mine);
  std::vector<double> sum(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(mine.size()));
  for (int r = 1; r < size_; ++r) {
    for (size_t i = 0; i < mine.size(); ++i) sum[i] += all[r * mine.size() + i];
  }
  return sum;
}

double Communicator::sum_control(double mine) {
  return sum_control(std::span<const double>(&mine, 1))[0];
}

double Communicator::max_control(double mine) {
  const std::vector<double> all = gather_control(std::span<const double>(&mine, 1));
  double m = all[0];
  for (double v : all) m = (m >= v || m != m) ? m : v;
  return m;
}

}  // namespace zerodp
