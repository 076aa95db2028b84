// The node-aware collectives of TransportCommunicator (comm/collectives_impl.h): two-level,
// qgZ and HSDP's node reduction. Notation as at the top of collectives.cc.
//
// Two-level (CommOptions::two_level, T ranks per node with 1 < T < N, P = N / T nodes,
// r = p * T + l, S_l = the elements owned by the P ranks of local index l). Node q's
// partial of range x is folded by x itself when it can read all of node q's inputs in
// place (on the local backend, always), else by (q, local(x)), which sends it:
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
//                   accumulator for sum_into), then finishes (comm/reduce.h, finish_sum). A
//                   packet of a peer here is quantized by the reader as its owner would.
//                   Whole ranges per message, no rounds: quantization blocks restart at each
//                   quantized buffer's start. Received: (T - 1) * sum_q Q(c_(q, l)) inside
//                   the node, (P - 1) * Q(c_r) across.
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
//   (T - 1) * min(K, c_l) * w bytes, then P * min(K, s_p) * w. Received:
//   (T - 1) * c_l * w inside the node, ((P - 1) * s_p + c_l - s_p) * w across.
//
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "comm/collectives_impl.h"
#include "comm/quantize.h"
#include "comm/reduce.h"

namespace zerodp::collectives_detail {

bool TransportCommunicator::folds_node_partial(int q) const {
  const int t = node_ranks();
  const int node = rank() / t;
  return q == node || !node_here(node, q * t + rank() % t);
}

TransportCommunicator::TwoLevelScratch TransportCommunicator::two_level_scratch(
    const Partition& part, DType dtype) {
  const int t = node_ranks();
  const int nodes = size() / t;
  const int node = rank() / t;
  const int local = rank() % t;
  const size_t w = dtype_size(dtype);
  const size_t chunk = chunk_elements(dtype);
  size_t widest = 0;  // the largest range of local index `local`
  for (int q = 0; q < nodes; ++q) widest = std::max(widest, part.count(q * t + local));
  TwoLevelScratch s;
  s.nodes = nodes;
  s.node = node;
  s.local = local;
  s.slot = std::min(chunk, widest) * w;
  s.own_slot = std::min(chunk, part.count(rank())) * w;
  // Pieces come from local peers in other processes only.
  const size_t peer_pieces = node_here(node, rank()) ? 0 : static_cast<size_t>((t - 1) * nodes);
  const size_t needed = (peer_pieces + static_cast<size_t>(nodes)) * s.slot +
                        static_cast<size_t>(nodes - 1) * s.own_slot;
  if (scratch_.size() < needed) scratch_.resize(needed);
  s.pieces = scratch_.data();
  s.partials = s.pieces + peer_pieces * s.slot;
  s.foreign_partials = s.partials + static_cast<size_t>(nodes) * s.slot;
  return s;
}

void TransportCommunicator::reduce_scatter_two_level(ConstBuffer in, MutableBuffer out,
                                                     const Partition& part, ReduceOp op) {
  constexpr std::string_view what = "reduce_scatter";
  const int t = node_ranks();
  const int nodes = size() / t;
  const int node = rank() / t;
  const int local = rank() % t;
  auto rank_of = [t](int q, int l) { return q * t + l; };
  const size_t w = dtype_size(in.dtype);
  const size_t chunk = chunk_elements(in.dtype);
  const size_t rounds = (part.max_count() + chunk - 1) / chunk;
  auto piece = [&](int x, size_t begin) { return round_piece(chunk, part.count(x), begin); };
  const TwoLevelScratch scratch = two_level_scratch(part, in.dtype);
  auto folds = [this](int q) { return folds_node_partial(q); };

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
      const int peer = rank_of(node, l);
      if (l == local || t_->here(peer)) continue;
      for (int q = 0; q < nodes; ++q) {
        const int theirs = rank_of(q, l);
        if (const size_t n = piece(theirs, begin); n > 0) {
          sends.push_back({peer, in_bytes + (part.offset(theirs) + begin) * w, n * w});
        }
        if (const size_t n = piece(rank_of(q, local), begin); n > 0) {
          recvs.push_back({peer, scratch.piece(l, q), n * w});
        }
      }
    }
    t_->exchange(what, Phase::kReduceScatterNode, sends, recvs);
    for (int q = 0; q < nodes; ++q) {
      const int owner = rank_of(q, local);
      const size_t n = piece(owner, begin);
      if (n == 0 || !folds(q)) continue;
      for (int l = 0; l < t; ++l) {
        const int peer = rank_of(node, l);
        node_inputs[static_cast<size_t>(l)] =
            l == local       ? static_cast<const void*>(in_bytes + (part.offset(owner) + begin) * w)
            : t_->here(peer) ? t_->in_of(peer) + (part.offset(owner) + begin) * w
                             : scratch.piece(l, q);
      }
      reduce_rank_order(node_inputs, scratch.partial(q), n, in.dtype, node_op);
    }
    // Across nodes, among the ranks of local index `local`: the partials of each range go
    // to its owner, or the owner folds them itself.
    sends.clear();
    recvs.clear();
    const size_t mine = piece(rank(), begin);
    for (int q = 0; q < nodes; ++q) {
      if (q == node) continue;
      const int peer = rank_of(q, local);
      if (const size_t n = piece(peer, begin); n > 0 && folds(q)) {
        sends.push_back({peer, scratch.partial(q), n * w});
      }
      if (mine > 0 && !node_here(q, rank())) recvs.push_back({peer, scratch.foreign(q), mine * w});
    }
    t_->exchange(what, Phase::kReduceScatterCross, sends, recvs);
    if (mine == 0) continue;
    for (int q = 0; q < nodes; ++q) {
      if (q != node && node_here(q, rank())) {
        for (int l = 0; l < t; ++l) {
          node_inputs[static_cast<size_t>(l)] =
              t_->in_of(rank_of(q, l)) + (part.offset(rank()) + begin) * w;
        }
        reduce_rank_order(node_inputs, scratch.foreign(q), mine, in.dtype, node_op);
      }
      node_partials[static_cast<size_t>(q)] = q == node ? scratch.partial(q) : scratch.foreign(q);
    }
    reduce_rank_order(node_partials, out_bytes + begin * dtype_size(out.dtype), mine, in.dtype, op,
                      size());
  }
}

void TransportCommunicator::reduce_scatter_quantized(ConstBuffer in, MutableBuffer out,
                                                     const Partition& part, ReduceOp op) {
  const BlockQuant quant = qgz_quant(options());
  QgzNode node = qgz_node_partials(in, part, quant);
  qgz_across_nodes(in, out, part, op, quant, node);
}

TransportCommunicator::QgzNode TransportCommunicator::qgz_scratch(const Partition& part,
                                                                  BlockQuant quant) {
  const int t = node_ranks();
  const int nodes = size() / t;
  const int node = rank() / t;
  const int local = rank() % t;
  auto rank_of = [t](int q, int l) { return q * t + l; };
  auto packed_bytes = [&](int x) { return quantized_bytes(part.count(x), quant); };
  auto folds = [this](int q) { return folds_node_partial(q); };
  // Scratch, in order: the packets this rank sends its local peers ([l' != local][q]), the
  // packets of its local peers ([l' != local][q], received or quantized here), its quantized
  // partials for the other nodes ([q != node]), one packet to quantize into and the other
  // nodes' packets of its own range ([q != node]). Partials: node `node`'s fp32 partial of
  // each range (q, local) it folds, one after another.
  size_t column_bytes = 0;  // the packets of the ranges of local index `local` folded here
  size_t column = 0;        // their elements
  size_t cross_bytes = 0;   // the partials sent across nodes
  for (int q = 0; q < nodes; ++q) {
    if (!folds(q)) continue;
    column_bytes += packed_bytes(rank_of(q, local));
    column += part.count(rank_of(q, local));
    if (q != node) cross_bytes += packed_bytes(rank_of(q, local));
  }
  size_t send_bytes = 0;
  for (int l = 0; l < t; ++l) {
    if (l == local || t_->here(rank_of(node, l))) continue;
    for (int q = 0; q < nodes; ++q) send_bytes += packed_bytes(rank_of(q, l));
  }
  const size_t needed = send_bytes + static_cast<size_t>(t - 1) * column_bytes + cross_bytes +
                        static_cast<size_t>(nodes) * packed_bytes(rank());
  if (qgz_packets_.size() < needed) qgz_packets_.resize(needed);
  if (qgz_partials_.size() < column) qgz_partials_.resize(column);
  QgzNode result;
  result.cursor = qgz_packets_.data();
  result.partials.resize(static_cast<size_t>(nodes));
  for (size_t q = 0, at = 0; q < result.partials.size(); ++q) {
    if (!folds(static_cast<int>(q))) continue;
    const size_t n = part.count(rank_of(static_cast<int>(q), local));
    result.partials[q] = std::span<float>(qgz_partials_.data() + at, n);
    at += n;
  }
  return result;
}

// The node phase, in the scratch qgz_scratch sized for both phases: node p's fp32 partials of
// the ranges (q, local) this rank folds.
TransportCommunicator::QgzNode TransportCommunicator::qgz_node_partials(ConstBuffer in,
                                                                        const Partition& part,
                                                                        BlockQuant quant) {
  constexpr std::string_view what = "reduce_scatter";
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
  auto folds = [this](int q) { return folds_node_partial(q); };
  QgzNode result = qgz_scratch(part, quant);
  auto take = [&result](size_t bytes) {
    std::byte* at = result.cursor;
    result.cursor += bytes;
    return at;
  };

  // Each local peer in another process gets this rank's own quantized copy of its ranges
  // (that peer folds all of them: it cannot read this node's inputs).
  std::vector<Message> sends;
  std::vector<Message> recvs;
  for (int l = 0; l < t; ++l) {
    const int peer = rank_of(node, l);
    if (l == local || t_->here(peer)) continue;
    for (int q = 0; q < nodes; ++q) {
      const int theirs = rank_of(q, l);
      if (part.count(theirs) == 0) continue;
      const size_t bytes = packed_bytes(theirs);
      std::byte* packet = take(bytes);
      quantize(input_of(theirs), std::span<std::byte>(packet, bytes), quant);
      sends.push_back({peer, packet, bytes});
    }
  }
  // Where the packet of range (q, local) from local peer l lands.
  std::vector<std::byte*> peer_packets(static_cast<size_t>(t * nodes), nullptr);
  for (int l = 0; l < t; ++l) {
    if (l == local) continue;
    for (int q = 0; q < nodes; ++q) {
      const int owner = rank_of(q, local);
      if (part.count(owner) == 0 || !folds(q)) continue;
      std::byte* packet = take(packed_bytes(owner));
      peer_packets[static_cast<size_t>(l * nodes + q)] = packet;
      const int peer = rank_of(node, l);
      if (t_->here(peer)) {
        // The packet that rank would send: its input's range, quantized as it would.
        const ConstBuffer theirs(t_->in_of(peer) + part.offset(owner) * w, part.count(owner),
                                 in.dtype);
        quantize(theirs, std::span<std::byte>(packet, packed_bytes(owner)), quant);
      } else {
        recvs.push_back({peer, packet, packed_bytes(owner)});
      }
    }
  }
  t_->exchange(what, Phase::kReduceScatterNode, sends, recvs);
  // In local rank order: this rank's input exact, its peers' dequantized.
  for (int q = 0; q < nodes; ++q) {
    const int owner = rank_of(q, local);
    std::span<float> partial = result.partials[static_cast<size_t>(q)];
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
  return result;
}

// Across nodes, among the ranks of local index `local`: each partial, quantized as one
// buffer, goes to the owner of its range; a node whose inputs this rank reads in place, it
// folds and quantizes itself as that node's rank (q, local) would. Then the total.
void TransportCommunicator::qgz_across_nodes(ConstBuffer in, MutableBuffer out,
                                             const Partition& part, ReduceOp op, BlockQuant quant,
                                             QgzNode& node_state) {
  constexpr std::string_view what = "reduce_scatter";
  const int t = node_ranks();
  const int nodes = size() / t;
  const int node = rank() / t;
  const int local = rank() % t;
  auto rank_of = [t](int q, int l) { return q * t + l; };
  auto packed_bytes = [&](int x) { return quantized_bytes(part.count(x), quant); };
  const size_t w = dtype_size(in.dtype);
  auto take = [&node_state](size_t bytes) {
    std::byte* at = node_state.cursor;
    node_state.cursor += bytes;
    return at;
  };
  const std::vector<std::span<float>>& partials = node_state.partials;
  std::vector<Message> sends;
  std::vector<Message> recvs;
  const size_t mine = part.count(rank());
  const size_t own_bytes = packed_bytes(rank());
  for (int q = 0; q < nodes; ++q) {
    const int peer = rank_of(q, local);
    if (q == node || part.count(peer) == 0 || node_here(node, peer)) continue;
    const size_t bytes = packed_bytes(peer);
    std::byte* packet = take(bytes);
    quantize(ConstBuffer(std::span<const float>(partials[static_cast<size_t>(q)])),
             std::span<std::byte>(packet, bytes), quant);
    sends.push_back({peer, packet, bytes});
  }
  std::vector<std::byte*> node_packets(static_cast<size_t>(nodes), nullptr);
  if (mine > 0) {
    const std::span<std::byte> spare(take(own_bytes), own_bytes);
    for (int q = 0; q < nodes; ++q) {
      if (q == node) continue;
      std::byte* packet = take(own_bytes);
      node_packets[static_cast<size_t>(q)] = packet;
      if (!node_here(q, rank())) {
        recvs.push_back({rank_of(q, local), packet, own_bytes});
        continue;
      }
      qgz_other_.assign(mine, 0.0f);
      for (int l = 0; l < t; ++l) {
        const ConstBuffer x(t_->in_of(rank_of(q, l)) + part.offset(rank()) * w, mine, in.dtype);
        if (l == local) {
          add_widened(x, qgz_other_);
        } else {
          quantize(x, spare, quant);
          dequantize_add(spare, qgz_other_, quant);
        }
      }
      quantize(ConstBuffer(std::span<const float>(qgz_other_)),
               std::span<std::byte>(packet, own_bytes), quant);
    }
  }
  t_->exchange(what, Phase::kReduceScatterCross, sends, recvs);
  if (mine == 0) return;
  // In node order from zero (kSumInto: from the accumulator): this node's partial exact,
  // the others' dequantized.
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
void TransportCommunicator::all_gather_two_level(MutableBuffer out, const Partition& part) {
  constexpr std::string_view what = "all_gather";
  const int t = node_ranks();
  const int nodes = size() / t;
  const int node = rank() / t;
  const int local = rank() % t;
  auto rank_of = [t](int q, int l) { return q * t + l; };
  const size_t w = dtype_size(out.dtype);
  auto* out_bytes = static_cast<std::byte*>(out.data);
  // Rank x's range of `out`, as a message to or from `peer`, and a copy from a rank here.
  auto range_of = [&](int peer, int x) {
    return Message{peer, out_bytes + part.offset(x) * w, part.count(x) * w};
  };
  auto copy_range = [&](const std::byte* from, int x) {
    if (part.count(x) > 0 && from != out_bytes + part.offset(x) * w) {
      std::memcpy(out_bytes + part.offset(x) * w, from, part.count(x) * w);
    }
  };
  std::vector<Message> sends;
  std::vector<Message> recvs;
  // Across nodes, among the ranks of local index `local`.
  for (int q = 0; q < nodes; ++q) {
    if (q == node) continue;
    const int peer = rank_of(q, local);
    if (t_->here(peer)) {
      copy_range(t_->in_of(peer), peer);
      continue;
    }
    if (part.count(rank()) > 0) sends.push_back(range_of(peer, rank()));
    if (part.count(peer) > 0) recvs.push_back(range_of(peer, peer));
  }
  t_->exchange(what, Phase::kAllGatherCross, sends, recvs);
  // Inside the node: the shards of local index `local` to every local peer, theirs back. A
  // local peer here has received the shards of its local index from other processes into
  // its output: those are copied from there once all have them.
  if (t_->here_count() > 1 && !t_->all_here()) {
    t_->meet(fmt::format("{} #{} (across nodes)", what, sequence_), Transport::Then::kReadPeers);
  }
  sends.clear();
  recvs.clear();
  for (int l = 0; l < t; ++l) {
    if (l == local) continue;
    const int peer = rank_of(node, l);
    if (t_->here(peer)) {
      for (int q = 0; q < nodes; ++q) {
        const int x = rank_of(q, l);
        copy_range(t_->here(x) ? t_->in_of(x) : t_->out_of(peer) + part.offset(x) * w, x);
      }
      continue;
    }
    for (int q = 0; q < nodes; ++q) {
      if (part.count(rank_of(q, local)) > 0) sends.push_back(range_of(peer, rank_of(q, local)));
      if (part.count(rank_of(q, l)) > 0) recvs.push_back(range_of(peer, rank_of(q, l)));
    }
  }
  t_->exchange(what, Phase::kAllGatherNode, sends, recvs);
}

// HSDP's gradient reduction (see the top of this file). This rank's node partial of range l
// is built in `out` when other nodes need it sent (or, with one rank per node, is this
// rank's input), so the only scratch is one round's pieces.
void TransportCommunicator::run_node_reduce_scatter(ConstBuffer in, MutableBuffer out,
                                                    const Partition& node_part, ReduceOp op) {
  constexpr std::string_view what = "node_reduce_scatter";
  agree(what,
        fingerprint(CollectiveKind::kNodeReduceScatter, node_part.length(), in.dtype,
                    static_cast<uint64_t>(op)),
        in.data, out.data);
  const int t = node_ranks();
  const int nodes = size() / t;
  const int local = rank() % t;
  const int first = node_first();
  const size_t w = dtype_size(in.dtype);
  const size_t chunk = chunk_elements(in.dtype);
  const size_t mine = node_part.count(local);
  auto* in_bytes = const_cast<std::byte*>(static_cast<const std::byte*>(in.data));
  auto* out_bytes = static_cast<std::byte*>(out.data);
  // Across nodes, the other nodes' ranks of this local index fold this node's partial
  // themselves (reading its inputs in place) or need it sent.
  const bool send_partial = nodes > 1 && !node_here(rank() / t, (rank() + t) % size());

  // Inside the node: every local peer's input of range `local`, folded in local rank order.
  // One node is the flat fold, finished here; over several it is the node partial, rounded
  // to the dtype. One rank per node has no partial to fold: its input is its node's.
  const std::byte* partial = in_bytes + node_part.offset(local) * w;
  if (t > 1 && (nodes == 1 || send_partial)) {
    const ReduceOp node_op = nodes == 1 ? op : node_partial_op(op);
    const size_t slot = std::min(chunk, mine) * w;  // one local peer's piece
    const size_t peer_slots = node_here(rank() / t, rank()) ? 0 : static_cast<size_t>(t - 1);
    if (scratch_.size() < peer_slots * slot) scratch_.resize(peer_slots * slot);
    auto peer_slot = [&](int l) {
      return scratch_.data() + static_cast<size_t>(l < local ? l : l - 1) * slot;
    };
    std::vector<const void*> node_inputs(static_cast<size_t>(t));
    std::vector<Message> sends;
    std::vector<Message> recvs;
    const size_t rounds = (node_part.max_count() + chunk - 1) / chunk;
    for (size_t k = 0; k < rounds; ++k) {
      const size_t begin = k * chunk;  // element offset of this round within each range
      sends.clear();
      recvs.clear();
      for (int l = 0; l < t; ++l) {
        if (l == local || t_->here(first + l)) continue;
        if (const size_t n = round_piece(chunk, node_part.count(l), begin); n > 0) {
          sends.push_back({first + l, in_bytes + (node_part.offset(l) + begin) * w, n * w});
        }
        if (const size_t n = round_piece(chunk, mine, begin); n > 0) {
          recvs.push_back({first + l, peer_slot(l), n * w});
        }
      }
      t_->exchange(what, Phase::kNodeReduceNode, sends, recvs);
      const size_t n = round_piece(chunk, mine, begin);
      if (n == 0) continue;
      const size_t at = (node_part.offset(local) + begin) * w;
      for (int l = 0; l < t; ++l) {
        node_inputs[static_cast<size_t>(l)] = l == local ? static_cast<const void*>(in_bytes + at)
                                              : t_->here(first + l) ? t_->in_of(first + l) + at
                                                                    : peer_slot(l);
      }
      reduce_rank_order(node_inputs, out_bytes + begin * w, n, in.dtype, node_op);
    }
    partial = out_bytes;
  } else if (nodes == 1) {
    // One rank in all: the fold of its input alone.
    const void* only = partial;
    reduce_rank_order(std::span<const void* const>(&only, 1), out.data, mine, in.dtype, op);
  }
  if (nodes > 1) fold_node_pieces(in, out, node_part, op, send_partial ? partial : nullptr);
  depart(what);
}

// Across nodes, among the ranks of local index l: an all-reduce of the node partials of
// range l split as Partition(c_l, P). `partial` is this node's (null when this rank folds
// every node's partial of its piece itself, reading their inputs in place).
void TransportCommunicator::fold_node_pieces(ConstBuffer in, MutableBuffer out,
                                             const Partition& node_part, ReduceOp op,
                                             const std::byte* partial) {
  constexpr std::string_view what = "node_reduce_scatter";
  const int t = node_ranks();
  const int nodes = size() / t;
  const int node = rank() / t;
  const int local = rank() % t;
  const size_t w = dtype_size(in.dtype);
  const size_t chunk = chunk_elements(in.dtype);
  const size_t mine = node_part.count(local);
  auto* out_bytes = static_cast<std::byte*>(out.data);
  const Partition pieces(mine, nodes);
  const size_t own = pieces.count(node);
  const size_t slot = std::min(chunk, own) * w;  // a node's partial of a round of the piece
  if (scratch_.size() < static_cast<size_t>(nodes) * slot) {
    scratch_.resize(static_cast<size_t>(nodes) * slot);
  }
  auto node_slot = [&](int q) { return scratch_.data() + static_cast<size_t>(q) * slot; };
  std::vector<const void*> node_inputs(static_cast<size_t>(t));
  std::vector<const void*> partials(static_cast<size_t>(nodes));
  std::vector<Message> sends;
  std::vector<Message> recvs;
  const size_t rounds = (pieces.max_count() + chunk - 1) / chunk;
  for (size_t k = 0; k < rounds; ++k) {
    const size_t begin = k * chunk;  // element offset of this round within each piece
    sends.clear();
    recvs.clear();
    for (int q = 0; q < nodes; ++q) {
      if (q == node) continue;
      const int peer = q * t + local;
      if (const size_t n = round_piece(chunk, pieces.count(q), begin); n > 0 && partial) {
        sends.push_back(
            {peer, const_cast<std::byte*>(partial) + (pieces.offset(q) + begin) * w, n * w});
      }
      if (const size_t n = round_piece(chunk, own, begin); n > 0 && !node_here(q, rank())) {
        recvs.push_back({peer, node_slot(q), n * w});
      }
    }
    t_->exchange(what, Phase::kNodeReduceCross, sends, recvs);
    const size_t n = round_piece(chunk, own, begin);
    if (n == 0) continue;
    const size_t at = pieces.offset(node) + begin;  // elements into range l
    const size_t in_at = (node_part.offset(local) + at) * w;
    for (int q = 0; q < nodes; ++q) {
      if (q == node && partial) {
        partials[static_cast<size_t>(q)] = partial + at * w;
      } else if (!node_here(q, rank())) {
        partials[static_cast<size_t>(q)] = node_slot(q);
      } else if (t == 1) {
        partials[static_cast<size_t>(q)] = t_->in_of(q) + in_at;  // the input is the partial
      } else {
        for (int l = 0; l < t; ++l) {
          node_inputs[static_cast<size_t>(l)] = t_->in_of(q * t + l) + in_at;
        }
        reduce_rank_order(node_inputs, node_slot(q), n, in.dtype, node_partial_op(op));
        partials[static_cast<size_t>(q)] = node_slot(q);
      }
    }
    reduce_rank_order(partials, out_bytes + at * w, n, in.dtype, op, size());
  }
  // Every rank of local index l now holds its folded piece: gather the others'.
  sends.clear();
  recvs.clear();
  const bool peers_here = t_->here((rank() + t) % size());
  for (int q = 0; q < nodes; ++q) {
    const int peer = q * t + local;
    if (q == node || peers_here) continue;
    if (own > 0) sends.push_back({peer, out_bytes + pieces.offset(node) * w, own * w});
    if (pieces.count(q) > 0) {
      recvs.push_back({peer, out_bytes + pieces.offset(q) * w, pieces.count(q) * w});
    }
  }
  t_->exchange(what, Phase::kNodeReduceGather, sends, recvs);
  if (!peers_here) return;
  t_->meet(fmt::format("{} #{} (folded)", what, sequence_), Transport::Then::kReadPeers);
  for (int q = 0; q < nodes; ++q) {
    if (q == node || pieces.count(q) == 0) continue;
    std::memcpy(out_bytes + pieces.offset(q) * w, t_->out_of(q * t + local) + pieces.offset(q) * w,
                pieces.count(q) * w);
  }
}

}  // namespace zerodp::collectives_detail
