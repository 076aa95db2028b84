// The communicator behind make_transport_communicator (comm/collectives.h), internal to
// src/comm: the flat collectives and the agreement in collectives.cc, the node-aware ones
// (two-level, qgZ, HSDP's node reduction) in node_collectives.cc.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "comm/quantize.h"
#include "comm/transport.h"

namespace zerodp::collectives_detail {

inline Fingerprint fingerprint(CollectiveKind kind, size_t count, DType dtype, uint64_t op) {
  return {static_cast<uint64_t>(kind), count, static_cast<uint64_t>(dtype), op, 0};
}

// Elements of a range of `count` in the round that starts at element `begin`.
inline size_t round_piece(size_t chunk, size_t count, size_t begin) {
  return begin < count ? std::min(chunk, count - begin) : size_t{0};
}

class TransportCommunicator final : public Communicator {
 public:
  TransportCommunicator(std::unique_ptr<Transport> transport, const CommOptions& options);
  ~TransportCommunicator() override { stop_worker(); }

  std::string_view backend_name() const override { return t_->name(); }
  void abort(const std::string& reason) noexcept override { t_->abort(reason); }

 protected:
  void collective_failed() noexcept override { t_->stop_reading(); }
  void run_reduce_scatter(ConstBuffer in, MutableBuffer out, const Partition& part,
                          ReduceOp op) override;
  void run_all_gather(ConstBuffer shard, MutableBuffer out, const Partition& part) override;
  void run_node_all_gather(ConstBuffer shard, MutableBuffer out,
                           const Partition& node_part) override;
  void run_node_reduce_scatter(ConstBuffer in, MutableBuffer out, const Partition& node_part,
                               ReduceOp op) override;
  void run_broadcast(MutableBuffer buf, int root) override;
  void run_gather_control(std::span<const double> mine, std::span<double> all) override;
  std::unique_ptr<Communicator> make_group(uint64_t split_id, std::span<const int> members,
                                           int index, const CommOptions& options) override {
    return std::make_unique<TransportCommunicator>(t_->group(split_id, members, index, options),
                                                   options);
  }

 private:
  // What qgZ's node phase leaves for its cross phase.
  struct QgzNode {
    std::vector<std::span<float>> partials;  // [q]: this node's of range (q, local), if folded
    std::byte* cursor = nullptr;             // the rest of the packets' scratch
  };

  // The two-level reduce-scatter's scratch (scratch_): [local peer l' (skipping `local`)][node
  // q] pieces, then [node q] partials, then [node q (skipping `node`)] partials of this rank's
  // range from the other nodes. `slot` bytes hold a piece or a partial of one round,
  // `own_slot` a foreign partial.
  struct TwoLevelScratch {
    std::byte* pieces = nullptr;
    std::byte* partials = nullptr;
    std::byte* foreign_partials = nullptr;
    size_t slot = 0;
    size_t own_slot = 0;
    int nodes = 0;
    int node = 0;
    int local = 0;
    std::byte* piece(int l, int q) const {
      const size_t peer = static_cast<size_t>(l < local ? l : l - 1);
      return pieces + (peer * static_cast<size_t>(nodes) + static_cast<size_t>(q)) * slot;
    }
    std::byte* partial(int q) const { return partials + static_cast<size_t>(q) * slot; }
    std::byte* foreign(int q) const {
      return foreign_partials + static_cast<size_t>(q < node ? q : q - 1) * own_slot;
    }
  };

  void reduce_scatter_flat(ConstBuffer in, MutableBuffer out, const Partition& part, ReduceOp op);
  // Sizes scratch_ for a two-level reduce-scatter over `part` and lays it out.
  TwoLevelScratch two_level_scratch(const Partition& part, DType dtype);
  void reduce_scatter_two_level(ConstBuffer in, MutableBuffer out, const Partition& part,
                                ReduceOp op);
  void reduce_scatter_quantized(ConstBuffer in, MutableBuffer out, const Partition& part,
                                ReduceOp op);
  // Sizes qgZ's packets' scratch for both phases (qgz_packets_) and places this node's fp32
  // partials of the ranges it folds (qgz_partials_); the cursor at the packets' start.
  QgzNode qgz_scratch(const Partition& part, BlockQuant quant);
  QgzNode qgz_node_partials(ConstBuffer in, const Partition& part, BlockQuant quant);
  void qgz_across_nodes(ConstBuffer in, MutableBuffer out, const Partition& part, ReduceOp op,
                        BlockQuant quant, QgzNode& node);
  void all_gather_two_level(MutableBuffer out, const Partition& part);
  // The ranges of ranks first .. first + count - 1 (range l of `part` is rank first + l's),
  // each from its rank into `out`: read in place from a rank here, received from another.
  void gather_ranges(std::string_view what, Phase phase, MutableBuffer out, const Partition& part,
                     int first, int count);
  // node_reduce_scatter's fold across nodes of this rank's piece, and the gather after it.
  void fold_node_pieces(ConstBuffer in, MutableBuffer out, const Partition& node_part, ReduceOp op,
                        const std::byte* partial);

  // Whether this rank folds its node's partial of range (q, local), local = rank() % T, in a
  // two-level or a quantized reduce-scatter: its own range's always; another's unless that
  // range's rank reads this node's inputs itself.
  bool folds_node_partial(int q) const;
  // Whether every rank of node q is here for rank x: then x folds node q's partials of its
  // range itself, reading their inputs in place, and nobody sends them.
  bool node_here(int q, int x) const {
    const int h = t_->here_count();
    const int t = node_ranks();
    return (q * t) / h == x / h && (q * t + t - 1) / h == x / h;
  }
  size_t chunk_elements(DType dtype) const {
    return std::max<size_t>(1, t_->chunk_bytes() / dtype_size(dtype));
  }

  // Numbers this collective, agrees on its fingerprint with every peer and publishes this
  // rank's buffers to the ranks here (collectives.cc).
  void agree(std::string_view what, Fingerprint f, const void* in, void* out);
  [[noreturn]] void mismatch(const Fingerprint& f, int peer, const Fingerprint& theirs);
  // Waits until the other ranks here are done reading this rank's buffers.
  void depart(std::string_view what);

  std::unique_ptr<Transport> t_;
  uint64_t sequence_ = 0;                  // collectives this rank has run
  std::vector<Fingerprint> fingerprints_;  // every rank's, for the collective being agreed
  // Scratch kept between calls. Receive buffers are members: a receive a failure leaves
  // behind must not land in freed memory (the transport refuses every later collective, so
  // they are not resized).
  std::vector<std::byte> scratch_;
  std::vector<std::byte> qgz_packets_;  // qgZ: quantized ranges and partials, sent and received
  std::vector<float> qgz_partials_;     // qgZ: this node's partials of local index rank() % T
  std::vector<float> qgz_other_;        // qgZ: another node's partial, folded here
  std::vector<float> qgz_total_;        // qgZ: the sum of this rank's range so far
};

}  // namespace zerodp::collectives_detail
