// The `mpi` backend (comm/mpi.h): one rank per process. MPI moves bytes; comm/reduce.h
// reduces, so results are the local backend's bits.
//
// How each collective runs on rank r of N (c_p elements in rank p's range, w wire bytes per
// element, K = chunk_bytes / w elements per chunk):
//   reduce_scatter  in rounds of K elements of each range: r sends piece k of range p to
//                   every peer p and receives piece k of range r from every peer into
//                   scratch, then reduces the N pieces in rank order (its own piece read
//                   from `in`, never sent to itself). Scratch: (N-1) * min(K, c_r) * w bytes,
//                   kept between calls.
//   all_gather      r sends its shard to every peer and receives every peer's shard straight
//                   into its range of `out`; no staging.
//   broadcast       MPI_Ibcast of bytes.
//   control         r sends its k doubles to every peer; a barrier sends 0 bytes.
// Two-level (CommOptions::two_level, T ranks per node with 1 < T < N, P = N / T nodes,
// r = p * T + l, S_l = the elements owned by the P ranks of local index l):
//   reduce_scatter  in rounds of K elements of each range, two phases per round. Inside the
//                   node, r sends each local peer (p, l') its pieces of every range (q, l')
//                   and receives theirs of every range (q, l), then folds the node's T pieces
//                   of each (q, l) in local rank order into a node partial of the dtype.
//                   Across nodes, r sends partial q to (q, l) and receives the P - 1 partials
//                   of its own range, then folds the P partials in node order. Scratch:
//                   (T - 1) * P pieces, P partials and P - 1 foreign partials, kept between
//                   calls. Received: (T - 1) * S_l * w inside the node, (P - 1) * c_r * w
//                   across.
//   all_gather      across nodes first: r sends its shard to every (q, l) and receives theirs
//                   into `out`; then inside the node: r sends each local peer the S_l
//                   elements of local index l now in `out` and receives their S_l' into
//                   `out`. No staging. Received: (S_l - c_r) * w across, (C - S_l) * w inside.
//   Broadcast and control stay flat.
// qgZ (CommOptions::qgz_bits, Q(c) = quantized_bytes(c), T = node_ranks or the world, with
// the same P, r = p * T + l and ranges c_(q, l)), whatever two_level says:
//   reduce_scatter  inside the node, r quantizes its input's range (q, l') for every node q and
//                   local peer l' (blocks from the range's start) and sends it to (p, l'); it
//                   receives each local peer's packet of every range (q, l) and folds node
//                   p's partial of each in fp32, in local rank order: its own input exact,
//                   the peers' dequantized. Across nodes, r quantizes partial q as one buffer
//                   and sends it to (q, l); it receives the other nodes' partials of its own
//                   range and folds them in node order, its own node's exact, from zero (the
//                   accumulator for sum_into), then finishes (comm/reduce.h, finish_sum).
//                   Whole ranges per message, no rounds. Scratch: every packet sent and
//                   received and the fp32 partials, kept between calls. Received:
//                   (T - 1) * sum_q Q(c_(q, l)) inside the node, (P - 1) * Q(c_r) across.
// node_reduce_scatter (HSDP's gradient reduction; T = node_ranks or the world, P = N / T,
// r = p * T + l, c_l the elements of range l of the node partition, s_q the elements of
// piece q of Partition(c_l, P)), whatever two_level says:
//   inside the node, in rounds of K elements of range l: r sends each local peer (p, l') its
//   input's piece of range l' and receives their pieces of range l, then folds the node's T
//   pieces in local rank order into `out`: the node partial, rounded to the dtype (with one
//   node the flat fold with the op, and the collective ends there). With T = 1 the partial
//   is r's input itself, unrounded. Across nodes, among the P ranks of local index l, an
//   all-reduce of the partial split into the P pieces, in rounds of K elements of each:
//   r sends piece q of its partial to (q, l) and receives piece p of the other nodes'
//   partials, folds the P of them in node order (avg: divided by N) into its piece of `out`;
//   then it sends that piece to every (q, l) and receives theirs into `out`. Scratch:
//   (T - 1) * min(K, c_l) * w bytes, then (P - 1) * min(K, s_p) * w. Received:
//   (T - 1) * c_l * w inside the node, ((P - 1) * s_p + c_l - s_p) * w across.
// Ranks as threads (MpiSession::make_communicators): the T_p ranks of a process share one
// communicator, on which a tag is (kind, sender's local index, receiver's local index), and
// a ThreadGroup. Every collective publishes its buffers to the group and meets the other
// ranks there (agree), and meets them again before returning (depart); each algorithm
// reads a same-process peer's range in place where it would receive it, and exchanges
// messages only with ranks of other processes. A broadcast is one MPI_Ibcast among the
// processes, issued by each process's first rank. The received bytes the ledger records are
// the same either way: it counts what a rank takes from its peers, however it travels.
// Every message is split into pieces of at most chunk_bytes, so counts of any size fit
// MPI 3's int counts. Point-to-point rather than MPI_Ialltoallv / MPI_Iallgatherv for three
// reasons: their displacements are int (2 GiB); own data need not travel to itself; and a
// timeout can name the peers whose messages did not arrive. Each rank receives exactly the
// bytes the ledger records (ledger.h): the ring algorithm's volume when flat, the volumes
// above when two-level or quantized.
//
// Threads: MPI is initialized at MPI_THREAD_SERIALIZED. Collectives run on each
// communicator's worker thread, while init, finalize, abort() and abort_job() run on the
// caller's; every MPI call in this file holds one process-wide mutex, and no call blocks in
// MPI (requests are polled with MPI_Test*), so the mutex is never held for long.
//
// Failure: each communicator keeps one receive posted for abort notices (tag kNoticeTag for
// its local index, any source; a notice starts with the failed rank). abort(reason) sends the
// reason to every peer; a peer polling a collective sees the notice and fails with CommError naming
// the rank and its reason. After any failure (notice, local abort, timeout, MPI error) the
// communicator refuses further collectives with the same error: messages of the failed collective
// may still be in flight, so the job should end (MpiSession::abort_job).

// Keep the deprecated C++ bindings out: they are not used and warn under -Wall.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "comm/mpi.h"
#include "comm/mpi_plumbing.h"
#include "comm/quantize.h"
#include "comm/reduce.h"
#include "comm/thread_group.h"
#include "core/error.h"

namespace zerodp {
namespace {

using namespace mpi_detail;

// Default upper bound of one message, and of one reduce-scatter round per peer. Large enough
// that per-message overhead is noise, small enough to bound the scratch buffer.
constexpr size_t kDefaultChunkBytes = size_t{8} << 20;
constexpr size_t kMaxChunkBytes = size_t{1} << 30;  // below INT_MAX: MPI 3 counts are int
constexpr const char* kChunkEnv = "ZERODP_MPI_CHUNK_BYTES";
// Abort notices carry at most this many bytes of the reason (small, so sent eagerly).
constexpr int kMaxNoticeBytes = 512;

// Tags: one per kind, so ranks that disagree on the order of collectives wait on different
// tags (and time out naming each other) instead of exchanging the wrong data.
constexpr int kReduceScatterTag = 1;
constexpr int kAllGatherTag = 2;
constexpr int kControlTag = 3;
constexpr int kNoticeTag = 4;
constexpr int kFingerprintTag = 5;
// The two phases of the two-level collectives: a message of one phase can never be taken
// for one of the other, whatever the peers' timing.
constexpr int kReduceScatterNodeTag = 6;
constexpr int kReduceScatterCrossTag = 7;
constexpr int kAllGatherCrossTag = 8;
constexpr int kAllGatherNodeTag = 9;
constexpr int kNodeAllGatherTag = 10;
// node_reduce_scatter's three phases: inside the node, the partials' pieces across nodes,
// the reduced pieces back.
constexpr int kNodeReduceNodeTag = 11;
constexpr int kNodeReduceCrossTag = 12;
constexpr int kNodeReduceGatherTag = 13;
constexpr int kTagCount = 14;
// An abort notice starts with the failed rank (a process may host several).
constexpr size_t kNoticeHeader = sizeof(int32_t);

// What a rank says it is about to do; ranks must agree before any data moves.
struct Fingerprint {
  // 1 reduce_scatter, 2 all_gather, 3 broadcast, 4 control, 5 node_all_gather,
  // 6 node_reduce_scatter
  uint64_t kind = 0;
  uint64_t count = 0;
  uint64_t dtype = 0;
  uint64_t op = 0;  // reduce op, or the broadcast's root
  uint64_t seq = 0;
  bool operator==(const Fingerprint&) const = default;
};

std::string describe(const Fingerprint& f) {
  static constexpr const char* kKinds[] = {
      "?",       "reduce_scatter",  "all_gather",         "broadcast",
      "control", "node_all_gather", "node_reduce_scatter"};
  const char* kind = f.kind < 7 ? kKinds[f.kind] : "?";
  std::string detail;
  if (f.kind == 1 || f.kind == 6) {
    detail = fmt::format("{} x {}, {}", f.count, dtype_name(static_cast<DType>(f.dtype)),
                         reduce_op_name(static_cast<ReduceOp>(f.op)));
  } else if (f.kind == 3) {
    detail =
        fmt::format("{} x {}, root {}", f.count, dtype_name(static_cast<DType>(f.dtype)), f.op);
  } else if (f.kind == 2 || f.kind == 5) {
    detail = fmt::format("{} x {}", f.count, dtype_name(static_cast<DType>(f.dtype)));
  } else {
    detail = fmt::format("{} values", f.count);
  }
  return fmt::format("{}({}) #{}", kind, detail, f.seq);
}

// Reads ZERODP_MPI_CHUNK_BYTES (tests set it small to exercise the split paths).
size_t chunk_bytes_from_env() {
  const char* text = std::getenv(kChunkEnv);
  if (text == nullptr || *text == '\0') return kDefaultChunkBytes;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (*end != '\0' || value == 0 || value > kMaxChunkBytes || text[0] == '-') {
    throw InvalidArgument(fmt::format("{}={} is not a valid chunk size; use a byte count in 1..{}",
                                      kChunkEnv, text, kMaxChunkBytes));
  }
  return static_cast<size_t>(value);
}

// The ranks one process hosts (MpiSession::make_communicators): T threads, ranks p * T ..
// p * T + T - 1 of a world of T ranks per process. They share one MPI communicator, on which
// a message's tag carries its kind and both ends' local indices, and read each other's
// buffers directly, meeting at the group's barrier.
struct ProcessGroup {
  struct alignas(64) Slot {
    const void* in = nullptr;
    void* out = nullptr;
    Fingerprint fingerprint;
  };
  // Takes ownership of `c`, a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN.
  ProcessGroup(MPI_Comm c, int t, int first_rank, double timeout_seconds)
      : comm(c), threads(t), slots(static_cast<size_t>(t)), meet(t, first_rank, timeout_seconds) {}
  ~ProcessGroup() {
    MutexLock lock(mpi_mutex());
    int finalized = 0;
    MPI_Finalized(&finalized);
    // After a failure, messages of the failed collective may still be in flight. Freeing
    // the communicator would let MPI give its context to a later communicator (MPICH does),
    // where those messages could match; so a failed one is left allocated. One per
    // failure, and a failure ends the job.
    if (!finalized && !failed.load()) MPI_Comm_free(&comm);
  }
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  MPI_Comm comm;
  const int threads;
  std::vector<Slot> slots;          // indexed by local index
  ThreadGroup meet;                 // the members' barrier and abort record
  std::atomic<bool> failed{false};  // a member failed: keep the communicator allocated
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(std::shared_ptr<ProcessGroup> group, int rank, int size,
                  const CommOptions& options, size_t chunk_bytes)
      : Communicator(rank, size, options),
        group_(std::move(group)),
        comm_(group_->comm),
        threads_(group_->threads),
        local_(rank % group_->threads),
        options_(options),
        chunk_bytes_(chunk_bytes) {
    // Set by any failure this process sees: its ranks' aborts and the notices they received.
    watch_abort_flag(&group_->failed);
    MutexLock lock(mpi_mutex());
    const int code = MPI_Irecv(notice_buffer_.data(), static_cast<int>(notice_buffer_.size()),
                               MPI_CHAR, MPI_ANY_SOURCE, notice_tag(rank), comm_, &notice_request_);
    if (code != MPI_SUCCESS) {
      failure_ = Failure{
          fmt::format("posting the abort-notice receive failed: {}", mpi_error_string(code)), -1,
          false};
    }
  }

  ~MpiCommunicator() override {
    stop_worker();
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

  std::string_view backend_name() const override { return "mpi"; }

  // Marks this communicator failed and tells every peer, so their pending and next
  // collectives fail naming this rank: the ranks of this process through the group's abort
  // record, the others by a notice. The notice is small (sent eagerly); abort() waits at
  // most a second for the sends to leave, then returns. A rank whose failure came from a
  // peer (a notice, or a member of its process) sends none: the peers heard it from the
  // rank at fault.
  void abort(const std::string& reason) noexcept override {
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
          if (MPI_Isend(notice_text_.data(), to_int(notice_text_.size()), MPI_CHAR,
                        process_of(peer), notice_tag(peer), comm_, &request) == MPI_SUCCESS) {
            sends.push_back(request);
          }
        }
      }
      poll(sends, nullptr, nullptr, nullptr,
           deadline_after(std::min(1.0, options_.timeout_seconds)), "abort");
      notice_sends_ = std::move(sends);  // any still pending are freed by the destructor
    } catch (...) {
      // abort() reports nothing: the caller is already handling a failure.
    }
  }

 protected:
  void run_reduce_scatter(ConstBuffer in, MutableBuffer out, const Partition& part,
                          ReduceOp op) override {
    constexpr std::string_view what = "reduce_scatter";
    check_usable(what);
    const auto deadline = deadline_after(options_.timeout_seconds);
    agree(what, {1, part.length(), static_cast<uint64_t>(in.dtype), static_cast<uint64_t>(op)},
          deadline, in.data, out.data);
    if (quantized_reduce_scatter()) {
      reduce_scatter_quantized(in, out, part, op, deadline);
    } else if (two_level()) {
      reduce_scatter_two_level(in, out, part, op, deadline);
    } else {
      reduce_scatter_flat(in, out, part, op, deadline);
    }
    depart(what);
  }

  void run_all_gather(ConstBuffer shard, MutableBuffer out, const Partition& part) override {
    constexpr std::string_view what = "all_gather";
    check_usable(what);
    const auto deadline = deadline_after(options_.timeout_seconds);
    agree(what, {2, part.length(), static_cast<uint64_t>(out.dtype), 0}, deadline, shard.data,
          out.data);
    const int me = rank();
    const size_t w = dtype_size(out.dtype);
    auto* out_bytes = static_cast<std::byte*>(out.data);
    std::byte* own = out_bytes + part.offset(me) * w;
    if (shard.count > 0 && shard.data != own) std::memcpy(own, shard.data, shard.bytes());
    if (two_level()) {
      all_gather_two_level(out, part, deadline);
    } else {
      std::vector<Message> sends;
      std::vector<Message> recvs;
      for (int peer = 0; peer < size(); ++peer) {
        if (peer == me) continue;
        if (here(peer)) {
          // A rank of this process: its shard, published for this collective.
          if (part.count(peer) > 0) {
            std::memcpy(out_bytes + part.offset(peer) * w, published_in(peer),
                        part.count(peer) * w);
          }
          continue;
        }
        if (part.count(me) > 0) sends.push_back({peer, own, part.count(me) * w});
        if (part.count(peer) > 0) {
          recvs.push_back({peer, out_bytes + part.offset(peer) * w, part.count(peer) * w});
        }
      }
      exchange(what, kAllGatherTag, sends, recvs, deadline);
    }
    depart(what);
  }

  // Like the flat all-gather, among the ranks of this rank's node only. The fingerprint
  // (kind 5) tells it from a world all-gather, which every rank also agrees on first.
  void run_node_all_gather(ConstBuffer shard, MutableBuffer out,
                           const Partition& node_part) override {
    constexpr std::string_view what = "node_all_gather";
    check_usable(what);
    const auto deadline = deadline_after(options_.timeout_seconds);
    agree(what, {5, node_part.length(), static_cast<uint64_t>(out.dtype), 0}, deadline, shard.data,
          out.data);
    const int first = node_first();
    const int local = rank() - first;
    const size_t w = dtype_size(out.dtype);
    auto* out_bytes = static_cast<std::byte*>(out.data);
    std::byte* own = out_bytes + node_part.offset(local) * w;
    if (shard.count > 0 && shard.data != own) std::memcpy(own, shard.data, shard.bytes());
    std::vector<Message> sends;
    std::vector<Message> recvs;
    for (int l = 0; l < node_part.world_size(); ++l) {
      if (l == local) continue;
      if (here(first + l)) {
        if (node_part.count(l) > 0) {
          std::memcpy(out_bytes + node_part.offset(l) * w, published_in(first + l),
                      node_part.count(l) * w);
        }
        continue;
      }
      if (node_part.count(local) > 0) sends.push_back({first + l, own, node_part.count(local) * w});
      if (node_part.count(l) > 0) {
        recvs.push_back({first + l, out_bytes + node_part.offset(l) * w, node_part.count(l) * w});
      }
    }
    exchange(what, kNodeAllGatherTag, sends, recvs, deadline);
    depart(what);
  }

  // HSDP's gradient reduction (see the top of this file). This rank's node partial of range
  // l is built in `out` (or, with one rank per node, is this rank's input), so the only
  // scratch is one round's pieces. Messages of 0 bytes are not sent, and both sides post the
  // messages of one phase between two ranks in the same order, so MPI's non-overtaking order
  // matches them. The peers across nodes (q, l) are never ranks of this process: a process's
  // ranks share a node.
  void run_node_reduce_scatter(ConstBuffer in, MutableBuffer out, const Partition& node_part,
                               ReduceOp op) override {
    constexpr std::string_view what = "node_reduce_scatter";
    check_usable(what);
    const auto deadline = deadline_after(options_.timeout_seconds);
    agree(what, {6, node_part.length(), static_cast<uint64_t>(in.dtype), static_cast<uint64_t>(op)},
          deadline, in.data, out.data);
    const int t = node_ranks();
    const int nodes = size() / t;
    const int node = rank() / t;
    const int local = rank() % t;
    const int first = node_first();
    const size_t w = dtype_size(in.dtype);
    const size_t chunk = std::max<size_t>(1, chunk_bytes_ / w);  // elements per round
    const size_t mine = node_part.count(local);
    auto* in_bytes = const_cast<std::byte*>(static_cast<const std::byte*>(in.data));
    auto* out_bytes = static_cast<std::byte*>(out.data);
    auto piece = [chunk](size_t count, size_t begin) {
      return begin < count ? std::min(chunk, count - begin) : size_t{0};
    };
    std::vector<Message> sends;
    std::vector<Message> recvs;

    // Inside the node: every local peer's input of range `local`, folded in local rank order.
    // One node is the flat fold, finished here; over several nodes it is the node partial,
    // rounded to the dtype. One rank per node has no partial to fold: its input is its node's.
    const std::byte* partial = in_bytes + node_part.offset(local) * w;
    if (t > 1) {
      const ReduceOp node_op = nodes == 1 ? op : node_partial_op(op);
      const size_t slot = std::min(chunk, mine) * w;  // one local peer's piece
      if (scratch_.size() < static_cast<size_t>(t - 1) * slot) {
        scratch_.resize(static_cast<size_t>(t - 1) * slot);
      }
      auto peer_slot = [&](int l) {
        return scratch_.data() + static_cast<size_t>(l < local ? l : l - 1) * slot;
      };
      std::vector<const void*> node_inputs(static_cast<size_t>(t));
      const size_t rounds = (node_part.max_count() + chunk - 1) / chunk;
      for (size_t k = 0; k < rounds; ++k) {
        const size_t begin = k * chunk;  // element offset of this round within each range
        sends.clear();
        recvs.clear();
        for (int l = 0; l < t; ++l) {
          if (l == local || here(first + l)) continue;
          if (const size_t n = piece(node_part.count(l), begin); n > 0) {
            sends.push_back({first + l, in_bytes + (node_part.offset(l) + begin) * w, n * w});
          }
          if (const size_t n = piece(mine, begin); n > 0) {
            recvs.push_back({first + l, peer_slot(l), n * w});
          }
        }
        exchange(what, kNodeReduceNodeTag, sends, recvs, deadline);
        const size_t n = piece(mine, begin);
        if (n == 0) continue;
        const size_t at = (node_part.offset(local) + begin) * w;
        for (int l = 0; l < t; ++l) {
          node_inputs[static_cast<size_t>(l)] = l == local ? static_cast<const void*>(in_bytes + at)
                                                : here(first + l) ? published_in(first + l) + at
                                                                  : peer_slot(l);
        }
        reduce_rank_order(node_inputs, out_bytes + begin * w, n, in.dtype, node_op);
      }
      if (nodes == 1) {
        depart(what);
        return;
      }
      partial = out_bytes;
    }

    // Across nodes, among the ranks of local index `local`: an all-reduce of the partials
    // split as Partition(mine, P). Node q's rank folds piece q of the P partials in node
    // order (dividing by the world for avg), then every rank gathers the folded pieces.
    const Partition pieces(mine, nodes);
    const size_t own = pieces.count(node);
    const size_t foreign_slot = std::min(chunk, own) * w;  // another node's partial piece
    if (scratch_.size() < static_cast<size_t>(nodes - 1) * foreign_slot) {
      scratch_.resize(static_cast<size_t>(nodes - 1) * foreign_slot);
    }
    auto node_slot = [&](int q) {
      return scratch_.data() + static_cast<size_t>(q < node ? q : q - 1) * foreign_slot;
    };
    std::vector<const void*> partials(static_cast<size_t>(nodes));
    const size_t rounds = (pieces.max_count() + chunk - 1) / chunk;
    for (size_t k = 0; k < rounds; ++k) {
      const size_t begin = k * chunk;  // element offset of this round within each piece
      sends.clear();
      recvs.clear();
      for (int q = 0; q < nodes; ++q) {
        if (q == node) continue;
        const int peer = q * t + local;
        if (const size_t n = piece(pieces.count(q), begin); n > 0) {
          sends.push_back(
              {peer, const_cast<std::byte*>(partial) + (pieces.offset(q) + begin) * w, n * w});
        }
        if (const size_t n = piece(own, begin); n > 0) recvs.push_back({peer, node_slot(q), n * w});
      }
      exchange(what, kNodeReduceCrossTag, sends, recvs, deadline);
      const size_t n = piece(own, begin);
      if (n == 0) continue;
      const size_t at = (pieces.offset(node) + begin) * w;
      for (int q = 0; q < nodes; ++q) {
        partials[static_cast<size_t>(q)] =
            q == node ? static_cast<const void*>(partial + at) : node_slot(q);
      }
      reduce_rank_order(partials, out_bytes + at, n, in.dtype, op, size());
    }
    sends.clear();
    recvs.clear();
    for (int q = 0; q < nodes; ++q) {
      if (q == node) continue;
      const int peer = q * t + local;
      if (own > 0) sends.push_back({peer, out_bytes + pieces.offset(node) * w, own * w});
      if (pieces.count(q) > 0) {
        recvs.push_back({peer, out_bytes + pieces.offset(q) * w, pieces.count(q) * w});
      }
    }
    exchange(what, kNodeReduceGatherTag, sends, recvs, deadline);
    depart(what);
  }

  // One MPI_Ibcast among the processes, issued by each process's first rank from the root's
  // buffer (on the root's process) or into its own; the other ranks of each process then
  // copy from that buffer.
  void run_broadcast(MutableBuffer buf, int root) override {
    constexpr std::string_view what = "broadcast";
    check_usable(what);
    const auto deadline = deadline_after(options_.timeout_seconds);
    agree(what, {3, buf.count, static_cast<uint64_t>(buf.dtype), static_cast<uint64_t>(root)},
          deadline, buf.data, buf.data);
    if (size() == 1 || buf.bytes() == 0) {
      depart(what);
      return;
    }
    const int first = rank() - local_;
    // Where this process's copy is: the root's buffer, or the first rank's once received.
    auto* source = static_cast<std::byte*>(here(root) ? published_out(root) : published_out(first));
    if (local_ == 0 && size() > threads_) {
      std::vector<MPI_Request> requests;
      {
        // Several nonblocking broadcasts may be outstanding; every rank issues them in order.
        MutexLock lock(mpi_mutex());
        for (size_t done = 0; done < buf.bytes(); done += chunk_bytes_) {
          MPI_Request request = MPI_REQUEST_NULL;
          const int code =
              MPI_Ibcast(source + done, to_int(std::min(chunk_bytes_, buf.bytes() - done)),
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
      finish(what, requests, std::vector<int>(requests.size(), -1), deadline,
             fmt::format("the broadcast from rank {}", root));
    }
    if (threads_ > 1) {
      // With no other process the root's buffer is this process's copy all along.
      if (size() > threads_) meet(fmt::format("{} #{} (received)", what, sequence_));
      if (source != buf.data) std::memcpy(buf.data, source, buf.bytes());
    }
    depart(what);
  }

  void run_gather_control(std::span<const double> mine, std::span<double> all) override {
    constexpr std::string_view what = "control";
    check_usable(what);
    const auto deadline = deadline_after(options_.timeout_seconds);
    agree(what, {4, mine.size(), 0, 0}, deadline, mine.data(), all.data());
    const int me = rank();
    const size_t k = mine.size();
    std::copy(mine.begin(), mine.end(), all.begin() + static_cast<ptrdiff_t>(k * me));
    // Messages of no values are sent too, so a call of none still waits for every rank.
    std::vector<Message> sends;
    std::vector<Message> recvs;
    for (int peer = 0; peer < size(); ++peer) {
      if (peer == me) continue;
      if (here(peer)) {
        const auto* theirs = reinterpret_cast<const double*>(published_in(peer));
        std::copy(theirs, theirs + k, all.begin() + static_cast<ptrdiff_t>(k * peer));
        continue;
      }
      sends.push_back({peer, reinterpret_cast<std::byte*>(const_cast<double*>(mine.data())),
                       k * sizeof(double)});
      recvs.push_back(
          {peer, reinterpret_cast<std::byte*>(all.data() + k * peer), k * sizeof(double)});
    }
    exchange(what, kControlTag, sends, recvs, deadline);
    depart(what);
  }

 private:
  struct Message {
    int peer = 0;
    std::byte* data = nullptr;  // read for a send, written for a receive
    size_t bytes = 0;
  };
  struct Failure {
    std::string message;  // why this communicator can no longer be used
    int failed_rank = -1;
    bool from_notice = false;
  };

  // The flat reduce-scatter (see the top of this file). The ranges of this process's ranks
  // are read from their inputs in place.
  void reduce_scatter_flat(ConstBuffer in, MutableBuffer out, const Partition& part, ReduceOp op,
                           Clock::time_point deadline) {
    constexpr std::string_view what = "reduce_scatter";
    const int me = rank();
    const int n = size();
    const size_t w = dtype_size(in.dtype);
    const size_t mine = part.count(me);
    const size_t chunk = std::max<size_t>(1, chunk_bytes_ / w);  // elements per round
    const size_t rounds = (part.max_count() + chunk - 1) / chunk;
    const size_t piece_bytes = std::min(chunk, mine) * w;  // scratch per peer
    if (scratch_.size() < static_cast<size_t>(n - 1) * piece_bytes) {
      scratch_.resize(static_cast<size_t>(n - 1) * piece_bytes);
    }
    const auto* in_bytes = static_cast<const std::byte*>(in.data);
    auto* out_bytes = static_cast<std::byte*>(out.data);
    std::vector<const void*> inputs(static_cast<size_t>(n));
    std::vector<Message> sends;
    std::vector<Message> recvs;
    for (size_t k = 0; k < rounds; ++k) {
      const size_t begin = k * chunk;  // element offset of this round within each range
      sends.clear();
      recvs.clear();
      for (int peer = 0; peer < n; ++peer) {
        if (peer == me || here(peer)) continue;
        const size_t theirs = part.count(peer);
        if (begin < theirs) {
          sends.push_back({peer, const_cast<std::byte*>(in_bytes) + (part.offset(peer) + begin) * w,
                           (std::min(chunk, theirs - begin)) * w});
        }
        if (begin < mine) {
          const size_t slot = static_cast<size_t>(peer < me ? peer : peer - 1);
          recvs.push_back(
              {peer, scratch_.data() + slot * piece_bytes, std::min(chunk, mine - begin) * w});
        }
      }
      exchange(what, kReduceScatterTag, sends, recvs, deadline);
      if (begin >= mine) continue;
      for (int peer = 0; peer < n; ++peer) {
        const size_t slot = static_cast<size_t>(peer < me ? peer : peer - 1);
        inputs[static_cast<size_t>(peer)] =
            peer == me   ? in_bytes + (part.offset(me) + begin) * w
            : here(peer) ? published_in(peer) + (part.offset(me) + begin) * w
                         : static_cast<const void*>(scratch_.data() + slot * piece_bytes);
      }
      reduce_rank_order(inputs, out_bytes + begin * dtype_size(out.dtype),
                        std::min(chunk, mine - begin), in.dtype, op);
    }
  }

  // The two-level reduce-scatter (see the top of this file). Messages of 0 bytes are not
  // sent: both sides derive every length from the partition and the round, and messages of
  // one phase between two ranks are posted in the same order (node q ascending) on both, so
  // MPI's non-overtaking order matches them.
  void reduce_scatter_two_level(ConstBuffer in, MutableBuffer out, const Partition& part,
                                ReduceOp op, Clock::time_point deadline) {
    constexpr std::string_view what = "reduce_scatter";
    const int t = options_.node_ranks;
    const int nodes = size() / t;
    const int node = rank() / t;
    const int local = rank() % t;
    auto rank_of = [t](int q, int l) { return q * t + l; };
    const size_t w = dtype_size(in.dtype);
    const size_t chunk = std::max<size_t>(1, chunk_bytes_ / w);  // elements per round
    const size_t rounds = (part.max_count() + chunk - 1) / chunk;
    // Elements of rank x's range in the round starting at `begin`.
    auto piece = [&](int x, size_t begin) {
      const size_t c = part.count(x);
      return begin < c ? std::min(chunk, c - begin) : size_t{0};
    };
    size_t widest = 0;  // the largest range of local index `local`
    for (int q = 0; q < nodes; ++q) widest = std::max(widest, part.count(rank_of(q, local)));
    const size_t slot = std::min(chunk, widest) * w;                  // a piece or a partial
    const size_t own_slot = std::min(chunk, part.count(rank())) * w;  // a foreign partial
    const size_t peer_pieces = static_cast<size_t>((t - 1) * nodes);
    const size_t needed = (peer_pieces + static_cast<size_t>(nodes)) * slot +
                          static_cast<size_t>(nodes - 1) * own_slot;
    if (scratch_.size() < needed) scratch_.resize(needed);
    // Scratch: [local peer l' (skipping `local`)][node q] pieces, then [node q] partials, then
    // [node q (skipping `node`)] partials of this rank's range from the other nodes.
    auto peer_index = [local](int l) { return static_cast<size_t>(l < local ? l : l - 1); };
    auto node_index = [node](int q) { return static_cast<size_t>(q < node ? q : q - 1); };
    std::byte* const pieces = scratch_.data();
    std::byte* const partials = pieces + peer_pieces * slot;
    std::byte* const foreign = partials + static_cast<size_t>(nodes) * slot;
    auto piece_slot = [&](int l, int q) {
      return pieces + (peer_index(l) * static_cast<size_t>(nodes) + static_cast<size_t>(q)) * slot;
    };
    auto partial_slot = [&](int q) { return partials + static_cast<size_t>(q) * slot; };
    auto foreign_slot = [&](int q) { return foreign + node_index(q) * own_slot; };

    auto* in_bytes = const_cast<std::byte*>(static_cast<const std::byte*>(in.data));
    auto* out_bytes = static_cast<std::byte*>(out.data);
    const ReduceOp node_op = node_partial_op(op);
    std::vector<const void*> node_inputs(static_cast<size_t>(t));
    std::vector<const void*> node_partials(static_cast<size_t>(nodes));
    std::vector<Message> sends;
    std::vector<Message> recvs;
    for (size_t k = 0; k < rounds; ++k) {
      const size_t begin = k * chunk;  // element offset of this round within each range
      // Inside the node: every local peer's pieces of the ranges of local index `local`.
      sends.clear();
      recvs.clear();
      for (int l = 0; l < t; ++l) {
        if (l == local || here(rank_of(node, l))) continue;
        const int peer = rank_of(node, l);
        for (int q = 0; q < nodes; ++q) {
          const int theirs = rank_of(q, l);
          if (const size_t n = piece(theirs, begin); n > 0) {
            sends.push_back({peer, in_bytes + (part.offset(theirs) + begin) * w, n * w});
          }
          if (const size_t n = piece(rank_of(q, local), begin); n > 0) {
            recvs.push_back({peer, piece_slot(l, q), n * w});
          }
        }
      }
      exchange(what, kReduceScatterNodeTag, sends, recvs, deadline);
      for (int q = 0; q < nodes; ++q) {
        const int owner = rank_of(q, local);
        const size_t n = piece(owner, begin);
        if (n == 0) continue;
        for (int l = 0; l < t; ++l) {
          const int peer = rank_of(node, l);
          node_inputs[static_cast<size_t>(l)] =
              l == local   ? static_cast<const void*>(in_bytes + (part.offset(owner) + begin) * w)
              : here(peer) ? published_in(peer) + (part.offset(owner) + begin) * w
                           : piece_slot(l, q);
        }
        reduce_rank_order(node_inputs, partial_slot(q), n, in.dtype, node_op);
      }
      // Across nodes, among the ranks of local index `local`: the partials of each range go
      // to its owner.
      sends.clear();
      recvs.clear();
      const size_t mine = piece(rank(), begin);
      for (int q = 0; q < nodes; ++q) {
        if (q == node) continue;
        const int peer = rank_of(q, local);
        if (const size_t n = piece(peer, begin); n > 0) {
          sends.push_back({peer, partial_slot(q), n * w});
        }
        if (mine > 0) recvs.push_back({peer, foreign_slot(q), mine * w});
      }
      exchange(what, kReduceScatterCrossTag, sends, recvs, deadline);
      if (mine == 0) continue;
      for (int q = 0; q < nodes; ++q) {
        node_partials[static_cast<size_t>(q)] = q == node ? partial_slot(q) : foreign_slot(q);
      }
      reduce_rank_order(node_partials, out_bytes + begin * dtype_size(out.dtype), mine, in.dtype,
                        op, size());
    }
  }

  // qgZ (see the top of this file). Whole ranges travel as one message each, which exchange()
  // splits into chunks: quantization blocks restart at each quantized buffer's start, so
  // rounds cut at chunk boundaries would quantize other blocks than the local backend does.
  // Messages of 0 bytes are not sent, and both sides post the messages of one phase between
  // two ranks in the same order (node q ascending), as in the two-level reduce-scatter.
  // Receive buffers are members: a receive a failure leaves behind must not land in freed
  // memory (the communicator refuses every later collective, so they are not resized).
  void reduce_scatter_quantized(ConstBuffer in, MutableBuffer out, const Partition& part,
                                ReduceOp op, Clock::time_point deadline) {
    constexpr std::string_view what = "reduce_scatter";
    const BlockQuant quant = qgz_quant(options_);
    const int t = node_ranks();
    const int nodes = size() / t;
    const int node = rank() / t;
    const int local = rank() % t;
    auto rank_of = [t](int q, int l) { return q * t + l; };
    auto packed_bytes = [&](int x) { return quantized_bytes(part.count(x), quant); };
    const size_t w = dtype_size(in.dtype);
    const auto* in_bytes = static_cast<const std::byte*>(in.data);
    // This rank's input of rank x's range.
    auto input_of = [&](int x) {
      return ConstBuffer(in_bytes + part.offset(x) * w, part.count(x), in.dtype);
    };

    // Scratch, in order: the packets this rank sends its local peers ([l' != local][q]), the
    // packets it receives from them ([l' != local][q]), its quantized partials for the other
    // nodes ([q != node]), and the other nodes' packets of its own range ([q != node]).
    // Partials: node `node`'s fp32 partial of each range (q, local), one after another.
    size_t column_bytes = 0;  // the packets of the ranges of local index `local`
    size_t column = 0;        // their elements
    for (int q = 0; q < nodes; ++q) {
      column_bytes += packed_bytes(rank_of(q, local));
      column += part.count(rank_of(q, local));
    }
    size_t send_bytes = 0;
    for (int l = 0; l < t; ++l) {
      if (l == local) continue;
      for (int q = 0; q < nodes; ++q) send_bytes += packed_bytes(rank_of(q, l));
    }
    const size_t own_bytes = packed_bytes(rank());
    const size_t needed = send_bytes + static_cast<size_t>(t - 1) * column_bytes +
                          (column_bytes - own_bytes) + static_cast<size_t>(nodes - 1) * own_bytes;
    if (qgz_packets_.size() < needed) qgz_packets_.resize(needed);
    if (qgz_partials_.size() < column) qgz_partials_.resize(column);
    std::byte* cursor = qgz_packets_.data();
    auto take = [&cursor](size_t bytes) {
      std::byte* at = cursor;
      cursor += bytes;
      return at;
    };
    // Where the packet of range (q, local) from local peer l lands, and the other nodes'.
    std::vector<std::byte*> peer_packets(static_cast<size_t>(t * nodes), nullptr);
    std::vector<std::byte*> node_packets(static_cast<size_t>(nodes), nullptr);
    std::vector<std::span<float>> partials(static_cast<size_t>(nodes));
    for (size_t q = 0, at = 0; q < partials.size(); ++q) {
      const size_t n = part.count(rank_of(static_cast<int>(q), local));
      partials[q] = std::span<float>(qgz_partials_.data() + at, n);
      at += n;
    }

    // Inside the node: each local peer gets this rank's own quantized copy of its ranges.
    std::vector<Message> sends;
    std::vector<Message> recvs;
    for (int l = 0; l < t; ++l) {
      if (l == local || here(rank_of(node, l))) continue;
      const int peer = rank_of(node, l);
      for (int q = 0; q < nodes; ++q) {
        const int theirs = rank_of(q, l);
        if (part.count(theirs) == 0) continue;
        const size_t bytes = packed_bytes(theirs);
        std::byte* packet = take(bytes);
        quantize(input_of(theirs), std::span<std::byte>(packet, bytes), quant);
        sends.push_back({peer, packet, bytes});
      }
    }
    for (int l = 0; l < t; ++l) {
      if (l == local) continue;
      for (int q = 0; q < nodes; ++q) {
        const int owner = rank_of(q, local);
        if (part.count(owner) == 0) continue;
        std::byte* packet = take(packed_bytes(owner));
        peer_packets[static_cast<size_t>(l * nodes + q)] = packet;
        const int peer = rank_of(node, l);
        if (here(peer)) {
          // The packet that rank would send: its input's range, quantized as it would.
          const ConstBuffer theirs(published_in(peer) + part.offset(owner) * w, part.count(owner),
                                   in.dtype);
          quantize(theirs, std::span<std::byte>(packet, packed_bytes(owner)), quant);
        } else {
          recvs.push_back({peer, packet, packed_bytes(owner)});
        }
      }
    }
    exchange(what, kReduceScatterNodeTag, sends, recvs, deadline);
    // Node partials, in local rank order: this rank's input exact, its peers' dequantized.
    for (int q = 0; q < nodes; ++q) {
      const int owner = rank_of(q, local);
      std::span<float> partial = partials[static_cast<size_t>(q)];
      if (partial.empty()) continue;
      std::fill(partial.begin(), partial.end(), 0.0f);
      for (int l = 0; l < t; ++l) {
        if (l == local) {
          add_widened(input_of(owner), partial);
        } else {
          const std::byte* packet = peer_packets[static_cast<size_t>(l * nodes + q)];
          dequantize_add(std::span<const std::byte>(packet, packed_bytes(owner)), partial, quant);
        }
      }
    }

    // Across nodes, among the ranks of local index `local`: each partial, quantized as one
    // buffer, goes to the owner of its range.
    sends.clear();
    recvs.clear();
    const size_t mine = part.count(rank());
    for (int q = 0; q < nodes; ++q) {
      if (q == node) continue;
      const int peer = rank_of(q, local);
      if (part.count(peer) == 0) continue;
      const size_t bytes = packed_bytes(peer);
      std::byte* packet = take(bytes);
      quantize(ConstBuffer(std::span<const float>(partials[static_cast<size_t>(q)])),
               std::span<std::byte>(packet, bytes), quant);
      sends.push_back({peer, packet, bytes});
    }
    if (mine > 0) {
      for (int q = 0; q < nodes; ++q) {
        if (q == node) continue;
        std::byte* packet = take(own_bytes);
        node_packets[static_cast<size_t>(q)] = packet;
        recvs.push_back({rank_of(q, local), packet, own_bytes});
      }
    }
    exchange(what, kReduceScatterCrossTag, sends, recvs, deadline);
    if (mine == 0) return;
    // The total, in node order from zero (kSumInto: from the accumulator): this node's
    // partial exact, the others' dequantized.
    if (op == ReduceOp::kSumInto) {
      qgz_total_.assign(static_cast<const float*>(out.data),
                        static_cast<const float*>(out.data) + mine);
    } else {
      qgz_total_.assign(mine, 0.0f);
    }
    for (int q = 0; q < nodes; ++q) {
      if (q == node) {
        const std::span<const float> partial = partials[static_cast<size_t>(q)];
        for (size_t i = 0; i < mine; ++i) qgz_total_[i] += partial[i];
      } else {
        dequantize_add(std::span<const std::byte>(node_packets[static_cast<size_t>(q)], own_bytes),
                       qgz_total_, quant);
      }
    }
    finish_sum(qgz_total_, out, op, size());
  }

  // The two-level all-gather, once this rank's shard is at its range of `out`.
  void all_gather_two_level(MutableBuffer out, const Partition& part, Clock::time_point deadline) {
    constexpr std::string_view what = "all_gather";
    const int t = options_.node_ranks;
    const int nodes = size() / t;
    const int node = rank() / t;
    const int local = rank() % t;
    auto rank_of = [t](int q, int l) { return q * t + l; };
    const size_t w = dtype_size(out.dtype);
    auto* out_bytes = static_cast<std::byte*>(out.data);
    // Rank x's range of `out`, as a message to or from `peer`.
    auto range_of = [&](int peer, int x) {
      return Message{peer, out_bytes + part.offset(x) * w, part.count(x) * w};
    };
    std::vector<Message> sends;
    std::vector<Message> recvs;
    // Across nodes, among the ranks of local index `local`.
    for (int q = 0; q < nodes; ++q) {
      if (q == node) continue;
      const int peer = rank_of(q, local);
      if (part.count(rank()) > 0) sends.push_back(range_of(peer, rank()));
      if (part.count(peer) > 0) recvs.push_back(range_of(peer, peer));
    }
    exchange(what, kAllGatherCrossTag, sends, recvs, deadline);
    // Inside the node: the shards of local index `local` to every local peer, theirs back;
    // the ranks of this process copy from each other's outputs once all have them.
    if (threads_ > 1) meet(fmt::format("{} #{} (across nodes)", what, sequence_));
    sends.clear();
    recvs.clear();
    for (int l = 0; l < t; ++l) {
      if (l == local) continue;
      const int peer = rank_of(node, l);
      if (here(peer)) {
        const auto* theirs = static_cast<const std::byte*>(published_out(peer));
        for (int q = 0; q < nodes; ++q) {
          const int x = rank_of(q, l);
          if (part.count(x) > 0) {
            std::memcpy(out_bytes + part.offset(x) * w, theirs + part.offset(x) * w,
                        part.count(x) * w);
          }
        }
        continue;
      }
      for (int q = 0; q < nodes; ++q) {
        if (part.count(rank_of(q, local)) > 0) sends.push_back(range_of(peer, rank_of(q, local)));
        if (part.count(rank_of(q, l)) > 0) recvs.push_back(range_of(peer, rank_of(q, l)));
      }
    }
    exchange(what, kAllGatherNodeTag, sends, recvs, deadline);
  }

  // Posts every receive, then every send, each split into pieces of at most chunk_bytes_
  // (a message of 0 bytes is sent as one empty piece), and waits for all of them.
  void exchange(std::string_view what, int tag, const std::vector<Message>& sends,
                const std::vector<Message>& recvs, Clock::time_point deadline) {
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
          const int count = to_int(std::min(chunk_bytes_, m.bytes - done));
          MPI_Request request = MPI_REQUEST_NULL;
          const int code = is_send ? MPI_Isend(m.data + done, count, MPI_BYTE, process_of(m.peer),
                                               wire_tag(tag, rank(), m.peer), comm_, &request)
                                   : MPI_Irecv(m.data + done, count, MPI_BYTE, process_of(m.peer),
                                               wire_tag(tag, m.peer, rank()), comm_, &request);
          if (code != MPI_SUCCESS) {
            throw CommError(
                fmt::format("{}: {} to rank {} failed: {}", what,
                            is_send ? "MPI_Isend" : "MPI_Irecv", m.peer, mpi_error_string(code)),
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
    finish(what, requests, peers, deadline, "");
  }

  // Waits for `requests`: point-to-point ones talking to peers[i], or (when `waiting_for`
  // is not empty) a nonblocking collective's, whose peers MPI does not tell. On a timeout,
  // an abort notice or an MPI error, records the failure, releases the requests and throws.
  void finish(std::string_view what, std::vector<MPI_Request>& requests,
              const std::vector<int>& peers, Clock::time_point deadline,
              const std::string& waiting_for) {
    const bool point_to_point = waiting_for.empty();
    auto release = [&] {
      if (point_to_point) release_pending(requests);
    };
    MPI_Status notice_status;
    PollResult result = PollResult::kDone;
    try {
      result = poll(requests, &notice_request_, &notice_status, &group_->meet.aborted_flag(),
                    deadline, what);
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
          what, sequence_, rank(), options_.timeout_seconds, whom, size());
      release();
      const int failed_rank = missing.size() == 1 ? missing[0] : -1;
      record_failure(message, failed_rank);
      throw CommTimeout(message, failed_rank);
    }
    release();
    check_usable(what);
  }

  // Throws CommError if this communicator failed earlier or a peer's notice has arrived.
  void check_usable(std::string_view what) {
    // With no other process no notice can come (the ranks here fail through the group).
    if (size() > threads_ && !failed()) {
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

  bool failed() {
    MutexLock lock(state_mutex_);
    return failure_.has_value();
  }
  // Also fails this process's other ranks: they may be waiting for this one at the barrier.
  void record_failure(std::string message, int failed_rank) {
    MutexLock lock(state_mutex_);
    if (failure_) return;
    failure_ = Failure{std::move(message), failed_rank, false};
    group_->failed = true;
    if (threads_ > 1)
      group_->meet.abort(failed_rank >= 0 ? failed_rank : rank(), failure_->message);
  }
  void record_notice(const MPI_Status& status) {
    int length = 0;
    {
      MutexLock lock(mpi_mutex());
      MPI_Get_count(&status, MPI_CHAR, &length);
    }
    // The sender's rank, then its reason (a malformed notice still names its process).
    int32_t sender = status.MPI_SOURCE * threads_;
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

  // Numbers this collective and, with check_collectives, compares fingerprints with every
  // peer in another process; a disagreement fails this rank naming the first peer that
  // differs (each rank sees every fingerprint, so every rank fails). Then publishes `in` and
  // `out` to the ranks of this process and waits for them (their fingerprints are compared
  // always: reading a peer's buffer with another length would be undefined behaviour).
  void agree(std::string_view what, Fingerprint f, Clock::time_point deadline, const void* in,
             void* out) {
    f.seq = ++sequence_;
    const int me = rank();
    if (options_.check_collectives && size() > threads_) {
      // A member, not a local: a receive an abort leaves behind must not land in freed memory.
      std::vector<Fingerprint>& all = fingerprints_;
      all.assign(static_cast<size_t>(size()), Fingerprint{});
      all[static_cast<size_t>(me)] = f;
      std::vector<Message> sends;
      std::vector<Message> recvs;
      for (int peer = 0; peer < size(); ++peer) {
        if (here(peer)) continue;
        sends.push_back({peer, reinterpret_cast<std::byte*>(&all[static_cast<size_t>(me)]),
                         sizeof(Fingerprint)});
        recvs.push_back({peer, reinterpret_cast<std::byte*>(&all[static_cast<size_t>(peer)]),
                         sizeof(Fingerprint)});
      }
      exchange(what, kFingerprintTag, sends, recvs, deadline);
      for (int peer = 0; peer < size(); ++peer) {
        if (here(peer) || all[static_cast<size_t>(peer)] == f) continue;
        mismatch(f, peer, all[static_cast<size_t>(peer)]);
      }
    }
    ProcessGroup::Slot& slot = group_->slots[static_cast<size_t>(local_)];
    slot.in = in;
    slot.out = out;
    slot.fingerprint = f;
    if (threads_ == 1) return;
    meet(describe(f));
    for (int l = 0; l < threads_; ++l) {
      const Fingerprint& other = group_->slots[static_cast<size_t>(l)].fingerprint;
      if (!(other == f)) mismatch(f, me - local_ + l, other);
    }
  }

  [[noreturn]] void mismatch(const Fingerprint& f, int peer, const Fingerprint& theirs) {
    const std::string reason =
        fmt::format("collective mismatch: rank {} called {}, rank {} called {}", rank(),
                    describe(f), peer, describe(theirs));
    record_failure(reason, peer);
    throw CommError(reason, peer);
  }

  // The barrier of this process's ranks; a failure there fails this communicator.
  void meet(const std::string& what) {
    try {
      group_->meet.arrive_and_wait(local_, what);
    } catch (const CommError& e) {
      record_failure(e.what(), e.failed_rank());
      throw;
    }
  }
  // Waits until the other ranks of this process are done reading this rank's buffers.
  void depart(std::string_view what) {
    if (threads_ > 1) meet(fmt::format("{} #{} (completion)", what, sequence_));
  }

  // Where a rank is: in this process (its buffers are read in place), or which process.
  bool here(int peer) const { return peer / threads_ == rank() / threads_; }
  int process_of(int peer) const { return peer / threads_; }
  // A message's tag on the shared communicator: its kind and both ends' local indices, so
  // the messages of different ranks of one process never match each other's receives.
  int wire_tag(int tag, int from, int to) const {
    return (tag * threads_ + from % threads_) * threads_ + to % threads_;
  }
  // Notices come from any rank, so their tag names the receiver only.
  int notice_tag(int to) const { return wire_tag(kNoticeTag, 0, to); }
  // What a rank of this process published for the current collective.
  const std::byte* published_in(int peer) const {
    return static_cast<const std::byte*>(group_->slots[static_cast<size_t>(peer % threads_)].in);
  }
  void* published_out(int peer) const {
    return group_->slots[static_cast<size_t>(peer % threads_)].out;
  }

  std::shared_ptr<ProcessGroup> group_;
  MPI_Comm comm_;  // the group's
  int threads_;    // ranks in this process
  int local_;      // this rank's index among them
  CommOptions options_;
  size_t chunk_bytes_;
  uint64_t sequence_ = 0;                  // collectives this rank has run
  std::vector<Fingerprint> fingerprints_;  // every rank's, for the collective being agreed
  std::vector<std::byte> scratch_;         // reduce-scatter pieces and partials (see the top)
  std::vector<std::byte> qgz_packets_;     // qgZ: quantized ranges and partials, sent and received
  std::vector<float> qgz_partials_;        // qgZ: this node's partials of local index rank() % T
  std::vector<float> qgz_total_;           // qgZ: the sum of this rank's range so far

  // Abort notices: one receive posted for the communicator's life (polled by the worker).
  std::array<char, kNoticeHeader + kMaxNoticeBytes> notice_buffer_{};
  MPI_Request notice_request_ GUARDED_BY(mpi_mutex()) = MPI_REQUEST_NULL;  // polled under it
  std::string notice_text_;                // what abort() sent; alive until the sends finish
  std::vector<MPI_Request> notice_sends_;  // freed by the destructor

  // Written by the worker and by abort() from any thread.
  Mutex state_mutex_;
  std::optional<Failure> failure_ GUARDED_BY(state_mutex_);
  bool notices_sent_ GUARDED_BY(state_mutex_) = false;
};

}  // namespace

bool mpi_backend_available() { return true; }

MpiSession::MpiSession(int& argc, char**& argv) {
  MutexLock lock(mpi_mutex());
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    throw InvalidArgument(
        "mpi: MPI is already initialized in this process; create one MpiSession per process");
  }
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    throw CommError(fmt::format("mpi: the MPI library provides {}, zerodp needs "
                                "MPI_THREAD_SERIALIZED or better (collectives run on a "
                                "communication thread); use an MPI built with thread support",
                                thread_level_name(provided)),
                    -1);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiSession::~MpiSession() {
  MutexLock lock(mpi_mutex());
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::vector<std::string> MpiSession::allgather_text(const std::string& mine) {
  constexpr size_t kSlot = 256;
  std::vector<char> out(kSlot, '\0');
  std::copy_n(mine.data(), std::min(mine.size(), kSlot - 1), out.begin());
  std::vector<char> all(kSlot * static_cast<size_t>(size_), '\0');
  {
    MutexLock lock(mpi_mutex());
    MPI_Allgather(out.data(), static_cast<int>(kSlot), MPI_CHAR, all.data(),
                  static_cast<int>(kSlot), MPI_CHAR, MPI_COMM_WORLD);
  }
  std::vector<std::string> texts;
  for (int p = 0; p < size_; ++p) texts.emplace_back(all.data() + static_cast<size_t>(p) * kSlot);
  return texts;
}

std::unique_ptr<Communicator> MpiSession::make_communicator(const CommOptions& options) {
  return std::move(make_communicators(options, 1).front());
}

std::vector<std::unique_ptr<Communicator>> MpiSession::make_communicators(
    const CommOptions& options, int ranks_per_process) {
  if (!(options.timeout_seconds > 0)) {
    throw InvalidArgument(
        fmt::format("mpi: timeout_seconds is {}; a collective's timeout must be positive",
                    options.timeout_seconds));
  }
  const int t = ranks_per_process;
  if (t < 1) {
    throw InvalidArgument(fmt::format(
        "--ranks-per-process {} is invalid; use 1 or more rank threads per MPI process", t));
  }
  if (options.node_ranks > 0 && options.node_ranks % t != 0) {
    throw InvalidArgument(fmt::format(
        "--ranks-per-process {} does not divide --node-ranks {}: a process's ranks must share "
        "a node; use a divisor of {}",
        t, options.node_ranks, options.node_ranks));
  }
  const size_t chunk_bytes = chunk_bytes_from_env();
  const auto deadline = deadline_after(options.timeout_seconds);
  constexpr std::string_view what = "mpi: creating a communicator";

  // A private duplicate of MPI_COMM_WORLD: its traffic cannot meet anyone else's.
  // MPI_Comm_idup rather than MPI_Comm_dup, so the mutex is not held while ranks gather.
  MPI_Comm comm = MPI_COMM_NULL;
  std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
  {
    MutexLock lock(mpi_mutex());
    check_mpi(MPI_Comm_idup(MPI_COMM_WORLD, &comm, requests.data()), what, "MPI_Comm_idup");
  }
  if (poll(requests, nullptr, nullptr, nullptr, deadline, what) != PollResult::kDone) {
    throw CommTimeout(fmt::format("{} on rank {} timed out after {} s: not every rank called "
                                  "make_communicator",
                                  what, rank_, options.timeout_seconds),
                      -1);
  }
  auto free_comm = [&comm] {
    MutexLock lock(mpi_mutex());
    MPI_Comm_free(&comm);
  };
  try {
    {
      MutexLock lock(mpi_mutex());
      check_mpi(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), what, "MPI_Comm_set_errhandler");
    }
    // Every rank must split messages the same way: agree on the chunk size.
    std::vector<uint64_t> chunks(static_cast<size_t>(size_));
    const uint64_t mine = chunk_bytes;
    requests.assign(1, MPI_REQUEST_NULL);
    {
      MutexLock lock(mpi_mutex());
      check_mpi(MPI_Iallgather(&mine, sizeof mine, MPI_BYTE, chunks.data(), sizeof mine, MPI_BYTE,
                               comm, requests.data()),
                what, "MPI_Iallgather");
    }
    if (poll(requests, nullptr, nullptr, nullptr, deadline, what) != PollResult::kDone) {
      throw CommTimeout(fmt::format("{} on rank {} timed out after {} s agreeing on the chunk size",
                                    what, rank_, options.timeout_seconds),
                        -1);
    }
    for (int r = 0; r < size_; ++r) {
      if (chunks[static_cast<size_t>(r)] != mine) {
        throw InvalidArgument(
            fmt::format("{}: {} is {} on rank {} but {} on rank {}; set it the same on every rank",
                        what, kChunkEnv, mine, rank_, chunks[static_cast<size_t>(r)], r));
      }
    }
    // Tags carry both ends' local indices: T^2 of them per kind must fit MPI's tag range.
    void* attribute = nullptr;
    int found = 0;
    {
      MutexLock lock(mpi_mutex());
      check_mpi(MPI_Comm_get_attr(comm, MPI_TAG_UB, &attribute, &found), what, "MPI_Comm_get_attr");
    }
    const long long tag_ub = found ? *static_cast<int*>(attribute) : 32767;
    const long long needed = static_cast<long long>(kTagCount) * t * t - 1;
    if (needed > tag_ub) {
      throw InvalidArgument(fmt::format(
          "--ranks-per-process {} needs message tags up to {}, but this MPI's largest is {}; "
          "use at most {} ranks per process",
          t, needed, tag_ub,
          static_cast<int>(std::sqrt(static_cast<double>(tag_ub + 1) / kTagCount))));
    }
  } catch (...) {
    free_comm();
    throw;
  }
  auto group = std::make_shared<ProcessGroup>(comm, t, rank_ * t, options.timeout_seconds);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int l = 0; l < t; ++l) {
    comms.push_back(
        std::make_unique<MpiCommunicator>(group, rank_ * t + l, size_ * t, options, chunk_bytes));
  }
  return comms;
}

// Ends holding the MPI mutex on purpose (checked: the analysis knows std::abort never returns).
void MpiSession::abort_job(int code, bool consequence) {
  // Launchers forward output asynchronously, and MPICH's Hydra drops what a rank printed
  // just before MPI_Abort about one time in ten: give the reason a moment to get out.
  std::fflush(stdout);
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(consequence ? 1200 : 200));
  // Held until the process ends: no other thread may enter MPI meanwhile.
  mpi_mutex().lock();
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // MPI_Abort does not return; if it ever did, the job must still end
}

}  // namespace zerodp
