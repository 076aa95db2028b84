// The collectives over a Transport (comm/collectives.h). Rank r of N; c_p elements in rank
// p's range, w bytes per element, K = chunk_bytes / w elements per round. Wherever a rank
// would receive a peer's data and that peer is here (transport.h), it reads the peer's
// published buffer in place instead, so on the local backend (every rank here) no message
// moves and under MPI only bytes for other processes do. The bytes each rank receives are
// those its CommLedger records (ledger.h), however they travel.
//
//   reduce_scatter  in rounds of K elements of each range: r sends piece k of range p to
//                   every peer p and receives piece k of range r from every peer into
//                   scratch, then reduces the N pieces in rank order (its own piece read
//                   from `in`, never sent to itself). Scratch: (N-1) * min(K, c_r) * w bytes,
//                   kept between calls.
//   all_gather      r sends its shard to every peer and receives every peer's shard straight
//                   into its range of `out`; no staging.
//   broadcast       the transport's broadcast between processes, then a copy inside each.
//   control         r sends its k doubles to every peer; a barrier sends 0 bytes.
//
// Every collective first agrees: the ranks compare fingerprints (with the ranks of other
// processes by message when CommOptions::check_collectives, with the ranks here always:
// reading a peer's buffer with another length would be undefined behaviour), publish their
// buffers and meet; and it meets the ranks here again before returning (depart), so none
// reuses a buffer another still reads. Messages of 0 bytes are not sent: both sides derive
// every length from the partition and the round, and post the messages of one phase between
// two ranks in the same order, so the transport's non-overtaking order matches them.
#include "comm/collectives.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "comm/quantize.h"
#include "comm/reduce.h"
#include "core/error.h"

#include "comm/collectives_impl.h"

namespace zerodp {

std::string describe(const Fingerprint& f) {
  static constexpr const char* kKinds[] = {
      "?",       "reduce_scatter",  "all_gather",         "broadcast",
      "control", "node_all_gather", "node_reduce_scatter"};
  const char* kind = f.kind < 7 ? kKinds[f.kind] : "?";
  std::string detail;
  const auto k = static_cast<CollectiveKind>(f.kind);
  if (k == CollectiveKind::kReduceScatter || k == CollectiveKind::kNodeReduceScatter) {
    detail = fmt::format("{} x {}, {}", f.count, dtype_name(static_cast<DType>(f.dtype)),
                         reduce_op_name(static_cast<ReduceOp>(f.op)));
  } else if (k == CollectiveKind::kBroadcast) {
    detail =
        fmt::format("{} x {}, root {}", f.count, dtype_name(static_cast<DType>(f.dtype)), f.op);
  } else if (k == CollectiveKind::kAllGather || k == CollectiveKind::kNodeAllGather) {
    detail = fmt::format("{} x {}", f.count, dtype_name(static_cast<DType>(f.dtype)));
  } else {
    detail = fmt::format("{} values", f.count);
  }
  return fmt::format("{}({}) #{}", kind, detail, f.seq);
}

namespace collectives_detail {

TransportCommunicator::TransportCommunicator(std::unique_ptr<Transport> transport,
                                             const CommOptions& options)
    : Communicator(transport->rank(), transport->size(), options), t_(std::move(transport)) {
  const int h = t_->here_count();
  if (!t_->all_here() && node_ranks() % h != 0) {
    throw InvalidArgument(fmt::format(
        "{}: {} ranks per process do not divide {} ranks per node: a process's ranks must "
        "share a node, or be the whole world",
        t_->name(), h, node_ranks()));
  }
  watch_abort_flag(t_->abort_flag());
}

void TransportCommunicator::run_reduce_scatter(ConstBuffer in, MutableBuffer out,
                                               const Partition& part, ReduceOp op) {
  constexpr std::string_view what = "reduce_scatter";
  agree(what,
        fingerprint(CollectiveKind::kReduceScatter, part.length(), in.dtype,
                    static_cast<uint64_t>(op)),
        in.data, out.data);
  if (quantized_reduce_scatter()) {
    reduce_scatter_quantized(in, out, part, op);
  } else if (two_level()) {
    reduce_scatter_two_level(in, out, part, op);
  } else {
    reduce_scatter_flat(in, out, part, op);
  }
  depart(what);
}

void TransportCommunicator::run_all_gather(ConstBuffer shard, MutableBuffer out,
                                           const Partition& part) {
  constexpr std::string_view what = "all_gather";
  agree(what, fingerprint(CollectiveKind::kAllGather, part.length(), out.dtype, 0), shard.data,
        out.data);
  const size_t w = dtype_size(out.dtype);
  std::byte* own = static_cast<std::byte*>(out.data) + part.offset(rank()) * w;
  if (shard.count > 0 && shard.data != own) std::memcpy(own, shard.data, shard.bytes());
  if (two_level()) {
    all_gather_two_level(out, part);
  } else {
    gather_ranges(what, Phase::kAllGather, out, part, 0, size());
  }
  depart(what);
}

// Like the flat all-gather, among the ranks of this rank's node only.
void TransportCommunicator::run_node_all_gather(ConstBuffer shard, MutableBuffer out,
                                                const Partition& node_part) {
  constexpr std::string_view what = "node_all_gather";
  agree(what, fingerprint(CollectiveKind::kNodeAllGather, node_part.length(), out.dtype, 0),
        shard.data, out.data);
  const int local = rank() - node_first();
  std::byte* own =
      static_cast<std::byte*>(out.data) + node_part.offset(local) * dtype_size(out.dtype);
  if (shard.count > 0 && shard.data != own) std::memcpy(own, shard.data, shard.bytes());
  gather_ranges(what, Phase::kNodeAllGather, out, node_part, node_first(), node_ranks());
  depart(what);
}

void TransportCommunicator::run_broadcast(MutableBuffer buf, int root) {
  constexpr std::string_view what = "broadcast";
  agree(what,
        fingerprint(CollectiveKind::kBroadcast, buf.count, buf.dtype, static_cast<uint64_t>(root)),
        buf.data, buf.data);
  if (size() == 1 || buf.bytes() == 0) {
    depart(what);
    return;
  }
  const int first = t_->first_here();
  // Where this process's copy is: the root's buffer, or the first rank's once received.
  std::byte* source = t_->here(root) ? t_->out_of(root) : t_->out_of(first);
  if (rank() == first && !t_->all_here()) {
    t_->broadcast_between(what, source, buf.bytes(), root);
  }
  if (t_->here_count() > 1) {
    if (!t_->all_here())
      t_->meet(fmt::format("{} #{} (received)", what, sequence_), Transport::Then::kReadPeers);
    if (source != buf.data) std::memcpy(buf.data, source, buf.bytes());
  }
  depart(what);
}

void TransportCommunicator::run_gather_control(std::span<const double> mine,
                                               std::span<double> all) {
  constexpr std::string_view what = "control";
  agree(what, fingerprint(CollectiveKind::kControl, mine.size(), DType::kF32, 0), mine.data(),
        all.data());
  const size_t k = mine.size();
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<ptrdiff_t>(k * rank()));
  // Messages of no values are sent too, so a call of none still waits for every rank.
  std::vector<Message> sends;
  std::vector<Message> recvs;
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank()) continue;
    if (t_->here(peer)) {
      const auto* theirs = reinterpret_cast<const double*>(t_->in_of(peer));
      std::copy(theirs, theirs + k, all.begin() + static_cast<ptrdiff_t>(k * peer));
      continue;
    }
    sends.push_back(
        {peer, reinterpret_cast<std::byte*>(const_cast<double*>(mine.data())), k * sizeof(double)});
    recvs.push_back(
        {peer, reinterpret_cast<std::byte*>(all.data() + k * peer), k * sizeof(double)});
  }
  t_->exchange(what, Phase::kControl, sends, recvs);
  depart(what);
}

// Numbers this collective, agrees on its fingerprint with every peer and publishes this
// rank's buffers to the ranks here (see the top of this file).
void TransportCommunicator::agree(std::string_view what, Fingerprint f, const void* in, void* out) {
  t_->start(what);
  f.seq = ++sequence_;
  const int me = rank();
  if (options().check_collectives && !t_->all_here()) {
    // A member, not a local: a receive a failure leaves behind must not land in freed memory.
    std::vector<Fingerprint>& all = fingerprints_;
    all.assign(static_cast<size_t>(size()), Fingerprint{});
    all[static_cast<size_t>(me)] = f;
    std::vector<Message> sends;
    std::vector<Message> recvs;
    for (int peer = 0; peer < size(); ++peer) {
      if (t_->here(peer)) continue;
      sends.push_back(
          {peer, reinterpret_cast<std::byte*>(&all[static_cast<size_t>(me)]), sizeof(Fingerprint)});
      recvs.push_back({peer, reinterpret_cast<std::byte*>(&all[static_cast<size_t>(peer)]),
                       sizeof(Fingerprint)});
    }
    t_->exchange(what, Phase::kFingerprint, sends, recvs);
    for (int peer = 0; peer < size(); ++peer) {
      if (t_->here(peer) || all[static_cast<size_t>(peer)] == f) continue;
      mismatch(f, peer, all[static_cast<size_t>(peer)]);
    }
  }
  t_->publish(in, out, f);
  if (t_->here_count() == 1) return;
  t_->meet(describe(f), Transport::Then::kReadPeers);
  for (int peer = t_->first_here(); peer < t_->first_here() + t_->here_count(); ++peer) {
    if (!(t_->fingerprint_of(peer) == f)) mismatch(f, peer, t_->fingerprint_of(peer));
  }
}

void TransportCommunicator::mismatch(const Fingerprint& f, int peer, const Fingerprint& theirs) {
  const std::string reason =
      fmt::format("collective mismatch: rank {} called {}, rank {} called {}", rank(), describe(f),
                  peer, describe(theirs));
  t_->fail(reason, peer);
  throw CommError(reason, peer);
}

// Waits until the other ranks here are done reading this rank's buffers.
void TransportCommunicator::depart(std::string_view what) {
  if (t_->here_count() > 1) {
    t_->meet(fmt::format("{} #{} (completion)", what, sequence_), Transport::Then::kDone);
  }
}

void TransportCommunicator::gather_ranges(std::string_view what, Phase phase, MutableBuffer out,
                                          const Partition& part, int first, int count) {
  const int me = rank() - first;
  const size_t w = dtype_size(out.dtype);
  auto* out_bytes = static_cast<std::byte*>(out.data);
  std::byte* own = out_bytes + part.offset(me) * w;
  std::vector<Message> sends;
  std::vector<Message> recvs;
  for (int l = 0; l < count; ++l) {
    if (l == me) continue;
    const int peer = first + l;
    if (t_->here(peer)) {
      // A rank here: its shard, published for this collective.
      if (part.count(l) > 0 && t_->in_of(peer) != out_bytes + part.offset(l) * w) {
        std::memcpy(out_bytes + part.offset(l) * w, t_->in_of(peer), part.count(l) * w);
      }
      continue;
    }
    if (part.count(me) > 0) sends.push_back({peer, own, part.count(me) * w});
    if (part.count(l) > 0) {
      recvs.push_back({peer, out_bytes + part.offset(l) * w, part.count(l) * w});
    }
  }
  t_->exchange(what, phase, sends, recvs);
}

// The ranges of this process's ranks are read from their inputs in place.
void TransportCommunicator::reduce_scatter_flat(ConstBuffer in, MutableBuffer out,
                                                const Partition& part, ReduceOp op) {
  constexpr std::string_view what = "reduce_scatter";
  const int me = rank();
  const int n = size();
  const size_t w = dtype_size(in.dtype);
  const size_t mine = part.count(me);
  const size_t chunk = chunk_elements(in.dtype);
  const size_t rounds = (part.max_count() + chunk - 1) / chunk;
  const size_t piece_bytes = t_->all_here() ? 0 : std::min(chunk, mine) * w;  // per peer
  if (scratch_.size() < static_cast<size_t>(n - 1) * piece_bytes) {
    scratch_.resize(static_cast<size_t>(n - 1) * piece_bytes);
  }
  const auto* in_bytes = static_cast<const std::byte*>(in.data);
  auto* out_bytes = static_cast<std::byte*>(out.data);
  auto slot_of = [&](int peer) {
    return scratch_.data() + static_cast<size_t>(peer < me ? peer : peer - 1) * piece_bytes;
  };
  std::vector<const void*> inputs(static_cast<size_t>(n));
  std::vector<Message> sends;
  std::vector<Message> recvs;
  for (size_t k = 0; k < rounds; ++k) {
    const size_t begin = k * chunk;  // element offset of this round within each range
    sends.clear();
    recvs.clear();
    for (int peer = 0; peer < n; ++peer) {
      if (peer == me || t_->here(peer)) continue;
      if (const size_t c = round_piece(chunk, part.count(peer), begin); c > 0) {
        sends.push_back(
            {peer, const_cast<std::byte*>(in_bytes) + (part.offset(peer) + begin) * w, c * w});
      }
      if (const size_t c = round_piece(chunk, mine, begin); c > 0) {
        recvs.push_back({peer, slot_of(peer), c * w});
      }
    }
    t_->exchange(what, Phase::kReduceScatter, sends, recvs);
    if (begin >= mine) continue;
    for (int peer = 0; peer < n; ++peer) {
      inputs[static_cast<size_t>(peer)] = peer == me ? in_bytes + (part.offset(me) + begin) * w
                                          : t_->here(peer)
                                              ? t_->in_of(peer) + (part.offset(me) + begin) * w
                                              : static_cast<const void*>(slot_of(peer));
    }
    reduce_rank_order(inputs, out_bytes + begin * dtype_size(out.dtype),
                      round_piece(chunk, mine, begin), in.dtype, op);
  }
}

}  // namespace collectives_detail

std::unique_ptr<Communicator> make_transport_communicator(std::unique_ptr<Transport> transport,
                                                          const CommOptions& options) {
  return std::make_unique<collectives_detail::TransportCommunicator>(std::move(transport), options);
}

}  // namespace zerodp
