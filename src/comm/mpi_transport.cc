// The MPI backend's transport (comm/transport.h): point-to-point messages of bytes between
// processes, the rank threads of one process as the ranks here, and the failure protocol.
//
// Every message is split into pieces of at most chunk_bytes, so counts of any size fit MPI
// 3's int counts. Point-to-point rather than MPI_Ialltoallv / MPI_Iallgatherv for three
// reasons: their displacements are int (2 GiB); own data need not travel to itself; and a
// timeout can name the peers whose messages did not arrive. A broadcast between processes
// is MPI_Ibcast of bytes, issued by each process's first rank.
//
// Ranks as threads (MpiSession::make_communicators): the T ranks of a process share one MPI
// communicator, on which a tag is (phase, sender's local index, receiver's local index), and
// a ThreadGroup, where they meet.
//
// Threads: MPI is initialized at MPI_THREAD_SERIALIZED. Collectives run on each
// communicator's worker thread, while init, finalize, abort() and abort_job() run on the
// caller's; every MPI call holds one process-wide mutex, and no call blocks in MPI (requests
// are polled with MPI_Test*), so the mutex is never held for long.
//
// Failure: each transport keeps one receive posted for abort notices (tag kNotice for its
// local index, any source; a notice starts with the failed rank). abort(reason) sends the
// reason to every peer; a peer polling a collective sees the notice and fails with CommError
// naming the rank and its reason. After any failure (notice, local abort, timeout, MPI error)
// the transport refuses further collectives with the same error: messages of the failed
// collective may still be in flight, so the job should end (MpiSession::abort_job).

// Keep the deprecated C++ bindings out: they are not used and warn under -Wall.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "comm/collectives.h"
#include "comm/mpi_plumbing.h"
#include "comm/thread_group.h"
#include "comm/transport.h"
#include "core/error.h"

namespace zerodp::mpi_detail {
namespace {

// Abort notices carry at most this many bytes of the reason (small, so sent eagerly).
constexpr int kMaxNoticeBytes = 512;
// An abort notice starts with the failed rank (a process may host several).
constexpr size_t kNoticeHeader = sizeof(int32_t);

// A duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN, shared by the transports that send on
// it (the world's, or the groups of one split), freed with the last of them.
struct WireComm {
  explicit WireComm(MPI_Comm c) : comm(c) {}
  ~WireComm() {
    MutexLock lock(mpi_mutex());
    int finalized = 0;
    MPI_Finalized(&finalized);
    // After a failure, messages of the failed collective may still be in flight. Freeing
    // the communicator would let MPI give its context to a later communicator (MPICH does),
    // where those messages could match; so a failed one is left allocated. One per
    // failure, and a failure ends the job.
    if (!finalized && !failed.load()) MPI_Comm_free(&comm);
  }
  WireComm(const WireComm&) = delete;
  WireComm& operator=(const WireComm&) = delete;
  MPI_Comm comm;
  std::atomic<bool> failed{false};
};

// The ranks of a world (or of a group split from it) that this process hosts: a block of
// consecutive ranks, first_rank .. first_rank + threads - 1. They share the wire and the
// slots where they publish their buffers, and meet at the group's barrier.
struct ProcessGroup {
  ProcessGroup(std::shared_ptr<WireComm> w, int t, int first_rank, double timeout_seconds)
      : wire(std::move(w)),
        comm(wire->comm),
        threads(t),
        slots(static_cast<size_t>(t)),
        meet(t, first_rank, timeout_seconds) {}
  ~ProcessGroup() {
    if (failed.load()) wire->failed = true;
  }
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  std::shared_ptr<WireComm> wire;
  MPI_Comm comm;
  const int threads;
  std::vector<PublishedSlot> slots;  // indexed by local index
  ThreadGroup meet;                  // the members' barrier and abort record
  std::atomic<bool> failed{false};   // a member failed: keep the communicator allocated

  // Splits of a world (not of a group: a new wire is a collective of every process, and a
  // group's members are not every process): split number -> its wire, made by this
  // process's first rank to ask; (split, first member) -> a group's part in this process.
  Mutex mu;
  CondVar wire_made;
  std::map<uint64_t, std::shared_ptr<WireComm>> split_wires GUARDED_BY(mu);
  std::map<uint64_t, std::string> split_errors GUARDED_BY(mu);
  std::map<std::pair<uint64_t, int>, std::weak_ptr<ProcessGroup>> split_groups GUARDED_BY(mu);
};

class MpiTransport final : public Transport {
 public:
  // `world_of`: each rank's world rank, and `world_threads` the world's ranks per process
  // (the identity and here_count for the world itself): what processes and tags are made of.
  MpiTransport(std::shared_ptr<ProcessGroup> group, int rank, int size, double timeout_seconds,
               size_t chunk_bytes, std::vector<int> world_of, int world_threads, bool is_world)
      : Transport(rank, size, group->threads, chunk_bytes, group->slots.data()),
        group_(std::move(group)),
        comm_(group_->comm),
        timeout_seconds_(timeout_seconds),
        world_of_(std::move(world_of)),
        world_threads_(world_threads),
        is_world_(is_world) {
    MutexLock lock(mpi_mutex());
    const int code = MPI_Irecv(notice_buffer_.data(), static_cast<int>(notice_buffer_.size()),
                               MPI_CHAR, MPI_ANY_SOURCE, notice_tag(rank), comm_, &notice_request_);
    if (code != MPI_SUCCESS) {
      failure_ = Failure{
          fmt::format("posting the abort-notice receive failed: {}", mpi_error_string(code)), -1,
          false};
    }
  }

  // Runs after the communicator's worker stopped (the communicator owns this transport).
  ~MpiTransport() override {
    bool failed_here = failed();
    int finalized = 0;
    MutexLock lock(mpi_mutex());
    MPI_Finalized(&finalized);
    if (finalized) return;  // the session ended first; nothing can be released any more
    if (notice_request_ != MPI_REQUEST_NULL) {
      // Cancelling an unmatched receive completes it at once; a matched one is a small
      // notice already arriving, and means a peer failed.
      MPI_Status status;
      MPI_Cancel(&notice_request_);
      MPI_Wait(&notice_request_, &status);
      int cancelled = 0;
      MPI_Test_cancelled(&status, &cancelled);
      if (!cancelled) failed_here = true;
    }
    for (MPI_Request& request : notice_sends_) {
      if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
    }
    if (failed_here) group_->failed = true;  // the group frees the communicator
  }

  std::string_view name() const override { return "mpi"; }

  void start(std::string_view what) override {
    ++collectives_;
    deadline_ = deadline_after(timeout_seconds_);
    check_usable(what);
  }

  // The barrier of this process's ranks; a failure there fails this transport.
  void meet(const std::string& what, Then then) override {
    if (here_count() == 1) return;
    try {
      group_->meet.arrive_and_wait(rank() % here_count(), what, then == Then::kReadPeers);
    } catch (const CommError& e) {
      record_failure(e.what(), e.failed_rank());
      throw;
    }
  }
  void stop_reading() noexcept override {
    if (here_count() > 1) group_->meet.leave(rank() % here_count());
  }

  void exchange(std::string_view what, Phase phase, const std::vector<Message>& sends,
                const std::vector<Message>& recvs) override;

  void broadcast_between(std::string_view what, std::byte* data, size_t bytes, int root) override {
    std::vector<MPI_Request> requests;
    {
      // Several nonblocking broadcasts may be outstanding; every rank issues them in order.
      MutexLock lock(mpi_mutex());
      for (size_t done = 0; done < bytes; done += chunk_bytes()) {
        MPI_Request request = MPI_REQUEST_NULL;
        const int code = MPI_Ibcast(data + done, to_int(std::min(chunk_bytes(), bytes - done)),
                                    MPI_BYTE, process_of(root), comm_, &request);
        if (code != MPI_SUCCESS) {
          record_failure(fmt::format("MPI_Ibcast failed: {}", mpi_error_string(code)), -1);
          break;
        }
        requests.push_back(request);
      }
    }
    check_usable(what);
    // MPI does not say which rank a broadcast waits for: the timeout names the root.
    finish(what, requests, std::vector<int>(requests.size(), -1),
           fmt::format("the broadcast from rank {}", root));
  }

  // Also fails this process's other ranks: they may be waiting for this one at the barrier.
  void fail(const std::string& reason, int failed_rank) override {
    record_failure(reason, failed_rank);
  }

  // Marks this transport failed and tells every peer, so their pending and next collectives
  // fail naming this rank: the ranks of this process through the group's abort record, the
  // others by a notice. The notice is small (sent eagerly); abort() waits at most a second
  // for the sends to leave, then returns. A rank whose failure came from a peer (a notice,
  // or a member of its process) sends none: the peers heard it from the rank at fault.
  void abort(const std::string& reason) noexcept override;

  const std::atomic<bool>* abort_flag() const override { return &group_->failed; }

  std::unique_ptr<Transport> group(uint64_t split_id, std::span<const int> members, int index,
                                   const CommOptions& options) override;

 private:
  std::shared_ptr<WireComm> split_wire(uint64_t split_id);

 public:
 private:
  struct Failure {
    std::string message;  // why this transport can no longer be used
    int failed_rank = -1;
    bool from_notice = false;
  };

  void finish(std::string_view what, std::vector<MPI_Request>& requests,
              const std::vector<int>& peers, const std::string& waiting_for);
  void check_usable(std::string_view what);
  bool failed() {
    MutexLock lock(state_mutex_);
    return failure_.has_value();
  }
  void record_failure(std::string message, int failed_rank) {
    MutexLock lock(state_mutex_);
    if (failure_) return;
    failure_ = Failure{std::move(message), failed_rank, false};
    group_->failed = true;
    if (here_count() > 1)
      group_->meet.abort(failed_rank >= 0 ? failed_rank : rank(), failure_->message);
  }
  void record_notice(const MPI_Status& status);

  int process_of(int peer) const { return world_of_[static_cast<size_t>(peer)] / world_threads_; }
  // A message's tag on the shared communicator: its phase and both ends' local indices in
  // their processes, so the messages of different ranks of one process (of any group sharing
  // the wire) never match each other's receives.
  int wire_tag(Phase phase, int from, int to) const {
    const int t = world_threads_;
    const int from_local = world_of_[static_cast<size_t>(from)] % t;
    const int to_local = world_of_[static_cast<size_t>(to)] % t;
    return (static_cast<int>(phase) * t + from_local) * t + to_local;
  }
  // Notices come from any rank, so their tag names the receiver only.
  int notice_tag(int to) const { return wire_tag(Phase::kNotice, 0, to); }

  std::shared_ptr<ProcessGroup> group_;
  MPI_Comm comm_;  // the group's
  const double timeout_seconds_;
  const std::vector<int> world_of_;
  const int world_threads_;
  const bool is_world_;
  Clock::time_point deadline_{};  // the current collective's
  uint64_t collectives_ = 0;      // started, for messages

  // Abort notices: one receive posted for the transport's life (polled by the worker).
  std::array<char, kNoticeHeader + kMaxNoticeBytes> notice_buffer_{};
  MPI_Request notice_request_ GUARDED_BY(mpi_mutex()) = MPI_REQUEST_NULL;  // polled under it
  std::string notice_text_;                // what abort() sent; alive until the sends finish
  std::vector<MPI_Request> notice_sends_;  // freed by the destructor

  // Written by the worker and by abort() from any thread.
  Mutex state_mutex_;
  std::optional<Failure> failure_ GUARDED_BY(state_mutex_);
  bool notices_sent_ GUARDED_BY(state_mutex_) = false;
};

void MpiTransport::abort(const std::string& reason) noexcept {
  try {
    {
      MutexLock lock(state_mutex_);
      if (notices_sent_) return;
      notices_sent_ = true;
      if (!failure_ && group_->meet.aborted() && group_->meet.failed_rank() != rank()) {
        failure_ = Failure{
            fmt::format("rank {} failed: {}", group_->meet.failed_rank(), group_->meet.failure()),
            group_->meet.failed_rank(), true};
      }
      if (!failure_) {
        failure_ = Failure{fmt::format("rank {} aborted: {}", rank(), reason), rank(), false};
      }
      group_->failed = true;
      if (failure_->from_notice) return;
    }
    // This rank's pending collective, if any, and its process's other ranks stop waiting.
    group_->meet.abort(rank(), reason);
    const int32_t me = rank();
    notice_text_.assign(reinterpret_cast<const char*>(&me), kNoticeHeader);
    notice_text_ += reason.substr(0, kMaxNoticeBytes);
    std::vector<MPI_Request> sends;
    {
      MutexLock lock(mpi_mutex());
      for (int peer = 0; peer < size(); ++peer) {
        if (here(peer)) continue;
        MPI_Request request = MPI_REQUEST_NULL;
        if (MPI_Isend(notice_text_.data(), to_int(notice_text_.size()), MPI_CHAR, process_of(peer),
                      notice_tag(peer), comm_, &request) == MPI_SUCCESS) {
          sends.push_back(request);
        }
      }
    }
    poll(sends, nullptr, nullptr, nullptr, deadline_after(std::min(1.0, timeout_seconds_)),
         "abort");
    notice_sends_ = std::move(sends);  // any still pending are freed by the destructor
  } catch (...) {
    // abort() reports nothing: the caller is already handling a failure.
  }
}

// Posts every receive, then every send, each split into pieces of at most chunk_bytes (a
// message of 0 bytes is sent as one empty piece), and waits for all of them.
void MpiTransport::exchange(std::string_view what, Phase phase, const std::vector<Message>& sends,
                            const std::vector<Message>& recvs) {
  if (sends.empty() && recvs.empty()) {
    check_usable(what);
    return;
  }
  std::vector<MPI_Request> requests;
  std::vector<int> peers;  // peers[i]: the rank requests[i] talks to
  {
    MutexLock lock(mpi_mutex());
    auto post = [&](const Message& m, bool is_send) {
      size_t done = 0;
      do {
        const int count = to_int(std::min(chunk_bytes(), m.bytes - done));
        MPI_Request request = MPI_REQUEST_NULL;
        const int code = is_send ? MPI_Isend(m.data + done, count, MPI_BYTE, process_of(m.peer),
                                             wire_tag(phase, rank(), m.peer), comm_, &request)
                                 : MPI_Irecv(m.data + done, count, MPI_BYTE, process_of(m.peer),
                                             wire_tag(phase, m.peer, rank()), comm_, &request);
        if (code != MPI_SUCCESS) {
          throw CommError(
              fmt::format("{}: {} to rank {} failed: {}", what, is_send ? "MPI_Isend" : "MPI_Irecv",
                          m.peer, mpi_error_string(code)),
              -1);
        }
        requests.push_back(request);
        peers.push_back(m.peer);
        done += static_cast<size_t>(count);
      } while (done < m.bytes);
    };
    try {
      for (const Message& m : recvs) post(m, false);
      for (const Message& m : sends) post(m, true);
    } catch (const CommError& e) {
      record_failure(e.what(), -1);
    }
  }
  if (failed()) release_pending(requests);
  check_usable(what);
  finish(what, requests, peers, "");
}

// Waits for `requests`: point-to-point ones talking to peers[i], or (when `waiting_for` is
// not empty) a nonblocking collective's, whose peers MPI does not tell. On a timeout, an
// abort notice or an MPI error, records the failure, releases the requests and throws.
void MpiTransport::finish(std::string_view what, std::vector<MPI_Request>& requests,
                          const std::vector<int>& peers, const std::string& waiting_for) {
  const bool point_to_point = waiting_for.empty();
  auto release = [&] {
    if (point_to_point) release_pending(requests);
  };
  MPI_Status notice_status;
  PollResult result = PollResult::kDone;
  try {
    result = poll(requests, &notice_request_, &notice_status, &group_->meet.aborted_flag(),
                  deadline_, what);
  } catch (const CommError& e) {
    record_failure(e.what(), -1);
    release();
    check_usable(what);
  }
  if (result == PollResult::kDone) return;
  if (result == PollResult::kNotice) {
    record_notice(notice_status);
  } else if (result == PollResult::kTimedOut) {
    std::vector<int> missing;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (requests[i] != MPI_REQUEST_NULL && peers[i] >= 0) missing.push_back(peers[i]);
    }
    std::sort(missing.begin(), missing.end());
    missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
    const std::string whom = !point_to_point ? waiting_for
                             : missing.size() == 1
                                 ? fmt::format("rank {}", missing[0])
                                 : fmt::format("ranks {}", fmt::join(missing, ", "));
    const std::string message = fmt::format(
        "{} #{} on rank {} timed out after {} s waiting for {} (world {}); a rank that never "
        "arrives is stuck, dead, or called a different collective",
        what, collectives_, rank(), timeout_seconds_, whom, size());
    release();
    const int failed_rank = missing.size() == 1 ? missing[0] : -1;
    record_failure(message, failed_rank);
    throw CommTimeout(message, failed_rank);
  }
  release();
  check_usable(what);
}

// Throws CommError if this transport failed earlier or a peer's notice has arrived.
void MpiTransport::check_usable(std::string_view what) {
  // With no other process no notice can come (the ranks here fail through the group).
  if (!all_here() && !failed()) {
    MPI_Status status;
    int arrived = 0;
    {
      MutexLock lock(mpi_mutex());
      if (notice_request_ != MPI_REQUEST_NULL) MPI_Test(&notice_request_, &arrived, &status);
    }
    if (arrived) record_notice(status);
  }
  MutexLock lock(state_mutex_);
  if (!failure_ && group_->meet.aborted()) {
    // Another rank of this process failed (or this one aborted).
    failure_ = Failure{
        fmt::format("rank {} failed: {}", group_->meet.failed_rank(), group_->meet.failure()),
        group_->meet.failed_rank(), group_->meet.failed_rank() != rank()};
  }
  if (!failure_) return;
  throw CommError(fmt::format("{} on rank {}: {}", what, rank(), failure_->message),
                  failure_->failed_rank);
}

void MpiTransport::record_notice(const MPI_Status& status) {
  int length = 0;
  {
    MutexLock lock(mpi_mutex());
    MPI_Get_count(&status, MPI_CHAR, &length);
  }
  // The sender's rank, then its reason (a malformed notice still names its process).
  int32_t sender = status.MPI_SOURCE * here_count();
  std::string reason;
  if (length >= static_cast<int>(kNoticeHeader)) {
    std::memcpy(&sender, notice_buffer_.data(), kNoticeHeader);
    reason.assign(notice_buffer_.data() + kNoticeHeader,
                  static_cast<size_t>(length) - kNoticeHeader);
  }
  MutexLock lock(state_mutex_);
  if (!failure_) {
    failure_ = Failure{fmt::format("rank {} failed: {}", sender, reason), sender, true};
    group_->failed = true;
  }
}

// A split of the world (Communicator::split): the group's ranks in this process must be a
// block of consecutive group ranks, aligned and of one size for every process with any (how
// islands of whole processes and columns of one rank per process come out); the groups of
// one split share a new wire, made once per process.
std::unique_ptr<Transport> MpiTransport::group(uint64_t split_id, std::span<const int> members,
                                               int index, const CommOptions& options) {
  if (!is_world_) {
    throw InvalidArgument(
        "mpi: a group cannot be split again (a new wire is a collective of every process); split "
        "the world");
  }
  std::vector<int> world_of(members.begin(), members.end());
  std::map<int, std::pair<int, int>> blocks;  // process -> (first group rank, count)
  for (size_t g = 0; g < world_of.size(); ++g) {
    auto [it, fresh] = blocks.try_emplace(process_of(world_of[g]), static_cast<int>(g), 0);
    if (it->second.first + it->second.second != static_cast<int>(g)) {
      throw InvalidArgument(
          fmt::format("mpi: split group of {} ranks has process {}'s ranks apart; keys must keep a "
                      "process's ranks together",
                      world_of.size(), it->first));
    }
    ++it->second.second;
  }
  const auto [first_here, here] = blocks.at(process_of(rank()));
  for (const auto& [process, block] : blocks) {
    if (block.second != here || block.first % here != 0) {
      throw InvalidArgument(fmt::format(
          "mpi: split group of {} ranks holds {} ranks of process {} and {} of this one; every "
          "process must hold as many of the group's ranks",
          world_of.size(), block.second, process, here));
    }
  }
  std::shared_ptr<WireComm> wire = split_wire(split_id);
  std::shared_ptr<ProcessGroup> part;
  {
    MutexLock lock(group_->mu);
    std::weak_ptr<ProcessGroup>& slot = group_->split_groups[{split_id, world_of.front()}];
    part = slot.lock();
    if (!part) {
      part = std::make_shared<ProcessGroup>(wire, here, first_here, options.timeout_seconds);
      slot = part;
    }
  }
  return std::make_unique<MpiTransport>(part, index, static_cast<int>(world_of.size()),
                                        options.timeout_seconds, chunk_bytes(), world_of,
                                        world_threads_, false);
}

// Split `split_id`'s wire: a duplicate of the world's, made by this process's first rank to
// ask (MPI_Comm_idup is a collective of every process, called once per process in split
// order, which the split's own world-wide exchange keeps), awaited by the others.
std::shared_ptr<WireComm> MpiTransport::split_wire(uint64_t split_id) {
  bool maker = false;
  {
    MutexLock lock(group_->mu);
    if (group_->split_wires.count(split_id) == 0) {
      group_->split_wires[split_id] = nullptr;
      maker = true;
    }
  }
  if (maker) {
    constexpr std::string_view what = "split";
    std::string error;
    MPI_Comm comm = MPI_COMM_NULL;
    std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
    try {
      {
        MutexLock lock(mpi_mutex());
        check_mpi(MPI_Comm_idup(comm_, &comm, requests.data()), what, "MPI_Comm_idup");
      }
      if (poll(requests, nullptr, nullptr, nullptr, deadline_after(timeout_seconds_), what) !=
          PollResult::kDone) {
        error = fmt::format("split on rank {} timed out after {} s making its communicator", rank(),
                            timeout_seconds_);
      } else {
        MutexLock lock(mpi_mutex());
        check_mpi(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), what,
                  "MPI_Comm_set_errhandler");
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    MutexLock lock(group_->mu);
    if (error.empty()) {
      group_->split_wires[split_id] = std::make_shared<WireComm>(comm);
    } else {
      group_->split_errors[split_id] = error;
    }
    group_->wire_made.notify_all();
  }
  MutexLock lock(group_->mu);
  for (;;) {
    if (const auto& wire = group_->split_wires[split_id]) return wire;
    if (const auto it = group_->split_errors.find(split_id); it != group_->split_errors.end()) {
      throw CommError(it->second, -1);
    }
    group_->wire_made.wait(group_->mu);
  }
}

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_process_communicators(MPI_Comm comm, int threads,
                                                                      int process, int processes,
                                                                      const CommOptions& options,
                                                                      size_t chunk_bytes) {
  auto group = std::make_shared<ProcessGroup>(std::make_shared<WireComm>(comm), threads,
                                              process * threads, options.timeout_seconds);
  std::vector<int> identity(static_cast<size_t>(processes * threads));
  for (size_t r = 0; r < identity.size(); ++r) identity[r] = static_cast<int>(r);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int l = 0; l < threads; ++l) {
    auto transport = std::make_unique<MpiTransport>(group, process * threads + l,
                                                    processes * threads, options.timeout_seconds,
                                                    chunk_bytes, identity, threads, true);
    comms.push_back(make_transport_communicator(std::move(transport), options));
  }
  return comms;
}

}  // namespace zerodp::mpi_detail
