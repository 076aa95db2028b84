#include "comm/local.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include <fmt/core.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/collectives.h"
#include "comm/thread_group.h"
#include "comm/transport.h"
#include "core/error.h"
#include "core/mutex.h"

namespace zerodp {

// State shared by the ranks of one local world: the abort record and barrier (ThreadGroup),
// and one slot per rank where it publishes the buffers of its current collective.
struct LocalWorld::Shared {
  Shared(int n, const CommOptions& opt)
      : world(n), options(opt), slots(static_cast<size_t>(n)), group(n, 0, opt.timeout_seconds) {}

  // Fails this world and every group split from it, so waits in a group end too.
  void abort(int rank, const std::string& reason) EXCLUDES(mu) {
    group.abort(rank, reason);
    std::vector<std::shared_ptr<Shared>> live;
    {
      MutexLock lock(mu);
      for (auto& [key, child] : groups) {
        if (auto c = child.lock()) live.push_back(std::move(c));
      }
    }
    for (auto& c : live) c->abort(-1, fmt::format("rank {} of the world failed: {}", rank, reason));
  }
  // The state of the group of split `split_id` whose first member is `first`: made by the
  // first member to ask, shared with the others.
  std::shared_ptr<Shared> group_of(uint64_t split_id, int first, int members,
                                   const CommOptions& opt) EXCLUDES(mu) {
    std::shared_ptr<Shared> child;
    {
      MutexLock lock(mu);
      std::weak_ptr<Shared>& slot = groups[{split_id, first}];
      child = slot.lock();
      if (!child) {
        child = std::make_shared<Shared>(members, opt);
        slot = child;
      }
    }
    if (group.aborted()) child->abort(group.failed_rank(), group.failure());
    return child;
  }

  const int world;
  const CommOptions options;
  std::vector<PublishedSlot> slots;
  ThreadGroup group;
  Mutex mu;
  std::map<std::pair<uint64_t, int>, std::weak_ptr<Shared>> groups GUARDED_BY(mu);
};

namespace {

// The rounds of the chunked collectives when nothing travels: long enough that a round's
// bookkeeping is noise, short enough that a two-level round's partials stay in cache.
constexpr size_t kLocalRoundBytes = size_t{1} << 20;

// Every rank is here: the collectives (comm/collectives.h) read the peers' buffers in place
// and exchange no message.
class LocalTransport final : public Transport {
 public:
  LocalTransport(int rank, std::shared_ptr<LocalWorld::Shared> shared)
      : Transport(rank, shared->world, shared->world, kLocalRoundBytes, shared->slots.data()),
        shared_(std::move(shared)) {}

  std::string_view name() const override { return "local"; }
  void start(std::string_view) override {
    if (shared_->group.aborted()) shared_->group.throw_aborted();
  }
  void meet(const std::string& what, Then then) override {
    shared_->group.arrive_and_wait(rank(), what, then == Then::kReadPeers);
  }
  void stop_reading() noexcept override { shared_->group.leave(rank()); }
  void exchange(std::string_view what, Phase, const std::vector<Message>& sends,
                const std::vector<Message>& recvs) override {
    if (!sends.empty() || !recvs.empty()) {
      throw Error(
          fmt::format("local backend: {} on rank {} would message rank {}, but every "
                      "rank is in this process",
                      what, rank(), sends.empty() ? recvs[0].peer : sends[0].peer));
    }
  }
  void broadcast_between(std::string_view what, std::byte*, size_t, int) override {
    throw Error(
        fmt::format("local backend: {} on rank {} has no other process to reach", what, rank()));
  }
  void fail(const std::string& reason, int failed_rank) override {
    shared_->group.abort(failed_rank, reason);
  }
  void abort(const std::string& reason) noexcept override {
    try {
      shared_->abort(rank(), reason);
    } catch (...) {
      // Aborting must not fail; the peers then fail by their timeout instead.
    }
  }
  const std::atomic<bool>* abort_flag() const override { return &shared_->group.aborted_flag(); }
  std::unique_ptr<Transport> group(uint64_t split_id, std::span<const int> members, int index,
                                   const CommOptions& options) override {
    if (!(options.timeout_seconds > 0)) {
      throw InvalidArgument(fmt::format(
          "collective timeout {} s is invalid; use a positive number of seconds (default 300)",
          options.timeout_seconds));
    }
    auto child =
        shared_->group_of(split_id, members.front(), static_cast<int>(members.size()), options);
    return std::make_unique<LocalTransport>(index, std::move(child));
  }

 private:
  std::shared_ptr<LocalWorld::Shared> shared_;
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
    comms_.push_back(
        make_transport_communicator(std::make_unique<LocalTransport>(r, shared_), options));
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
