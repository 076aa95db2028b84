// Transport: how one rank reaches the others' data, under the collectives of
// comm/collectives.h, which every backend shares (as gloo's algorithms sit over its pairs).
//
// A peer is reached one of two ways. The ranks "here" are threads of this rank's process
// (the whole world on the local backend, a process's rank threads under MPI): each publishes
// the buffers of its current collective, and the others read them in place once they have
// met. Every other rank is reached by messages of bytes, exchanged in phases. The ranks here
// are a block of consecutive ranks, and a block either lies inside one node or is the whole
// world (collectives.cc relies on it).
//
// Failure: after start() or any call here throws, the transport refuses every later
// collective with the same error (messages of the failed one may still be in flight).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"

namespace zerodp {

// What a rank says it is about to do; ranks must agree before any data moves. Plain data:
// it travels between processes as bytes.
enum class CollectiveKind : uint64_t {
  kReduceScatter = 1,
  kAllGather = 2,
  kBroadcast = 3,
  kControl = 4,
  kNodeAllGather = 5,
  kNodeReduceScatter = 6,
};
struct Fingerprint {
  uint64_t kind = 0;
  uint64_t count = 0;
  uint64_t dtype = 0;
  uint64_t op = 0;  // the reduce op, or the broadcast's root
  uint64_t seq = 0;
  bool operator==(const Fingerprint&) const = default;
};
// "reduce_scatter(300 x f32, sum) #1"
std::string describe(const Fingerprint& f);

// The phases of the collectives' message exchanges. Each has its own tag, so a message of
// one phase can never be taken for another's whatever the peers' timing, and ranks that
// disagree on the order of collectives wait on different tags (and time out naming each
// other) instead of exchanging the wrong data.
enum class Phase : int {
  kReduceScatter = 1,
  kAllGather = 2,
  kControl = 3,
  kNotice = 4,  // the MPI transport's abort notices
  kFingerprint = 5,
  kReduceScatterNode = 6,   // two-level and qgZ: inside the node
  kReduceScatterCross = 7,  // two-level and qgZ: the node partials across nodes
  kAllGatherCross = 8,
  kAllGatherNode = 9,
  kNodeAllGather = 10,
  kNodeReduceNode = 11,    // node_reduce_scatter: inside the node
  kNodeReduceCross = 12,   // the partials' pieces across nodes
  kNodeReduceGather = 13,  // the reduced pieces back
};
inline constexpr int kPhaseCount = 14;

// One message to or from `peer`: read for a send, written for a receive.
struct Message {
  int peer = 0;
  std::byte* data = nullptr;
  size_t bytes = 0;
};

// What a rank publishes to the ranks here for its current collective. One per rank here,
// shared by them; a cache line each, as ranks write their own concurrently.
struct alignas(64) PublishedSlot {
  const void* in = nullptr;
  void* out = nullptr;
  Fingerprint fingerprint;
};

class Transport {
 public:
  virtual ~Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The ranks here: first_here() .. first_here() + here_count() - 1.
  int here_count() const { return here_count_; }
  int first_here() const { return rank_ - rank_ % here_count_; }
  bool here(int peer) const { return peer / here_count_ == rank_ / here_count_; }
  bool all_here() const { return here_count_ == size_; }
  // The largest message, and the round of the chunked algorithms, in bytes.
  size_t chunk_bytes() const { return chunk_bytes_; }

  // Makes this rank's buffers and fingerprint visible to the ranks here (read after meet()).
  void publish(const void* in, void* out, const Fingerprint& f) {
    PublishedSlot& mine = slots_[rank_ % here_count_];
    mine.in = in;
    mine.out = out;
    mine.fingerprint = f;
  }
  // What rank `peer` (here) published.
  const std::byte* in_of(int peer) const {
    return static_cast<const std::byte*>(slots_[peer % here_count_].in);
  }
  std::byte* out_of(int peer) const {
    return static_cast<std::byte*>(slots_[peer % here_count_].out);
  }
  const Fingerprint& fingerprint_of(int peer) const {
    return slots_[peer % here_count_].fingerprint;
  }

  virtual std::string_view name() const = 0;
  // A collective begins: throws CommError if this rank can no longer communicate, and
  // starts the clock of its timeout.
  virtual void start(std::string_view what) = 0;
  // Waits until every rank here has called meet() as often (at once with none but this one).
  // `then`: whether this rank reads the published buffers of the ranks here before its next
  // meet. A rank that fails out of a meet waits until none still reads its buffers.
  enum class Then { kReadPeers, kDone };
  virtual void meet(const std::string& what, Then then) = 0;
  // This rank's collective failed between two meets: it no longer reads the ranks here.
  virtual void stop_reading() noexcept = 0;
  // Posts every receive, then every send (messages to ranks that are not here only), and
  // waits for all of them; throws CommTimeout naming the ranks that did not answer.
  virtual void exchange(std::string_view what, Phase phase, const std::vector<Message>& sends,
                        const std::vector<Message>& recvs) = 0;
  // `bytes` at `data` from root's process to this one; called by the first rank here of
  // every process, and only when the world spans processes.
  virtual void broadcast_between(std::string_view what, std::byte* data, size_t bytes,
                                 int root) = 0;
  // Records that this rank cannot go on because of `failed_rank` (-1: unknown): the ranks
  // here stop waiting for it, and every later collective fails with `reason`.
  virtual void fail(const std::string& reason, int failed_rank) = 0;
  // Communicator::abort: this rank failed; tells every peer. Never throws.
  virtual void abort(const std::string& reason) noexcept = 0;
  // Set once this rank or a peer it can see failed (Communicator::watch_abort_flag).
  virtual const std::atomic<bool>* abort_flag() const = 0;
  // This rank's transport among `members` (ranks of this transport, in the group's order;
  // this rank is members[index]) for split number `split_id` (Communicator::split). Called by
  // every member; InvalidArgument for a group this transport cannot make.
  virtual std::unique_ptr<Transport> group(uint64_t split_id, std::span<const int> members,
                                           int index, const CommOptions& options) = 0;

 protected:
  // `slots`: one per rank here, indexed by rank % here_count, alive as long as the transport.
  Transport(int rank, int size, int here_count, size_t chunk_bytes, PublishedSlot* slots)
      : rank_(rank),
        size_(size),
        here_count_(here_count),
        chunk_bytes_(chunk_bytes),
        slots_(slots) {}

 private:
  const int rank_;
  const int size_;
  const int here_count_;
  const size_t chunk_bytes_;
  PublishedSlot* const slots_;
};

}  // namespace zerodp
