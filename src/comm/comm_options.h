// CommOptions: how a communicator runs its collectives (timeout, checks, the simulated link,
// nodes, two-level and quantized algorithms). A plain struct with defaults, in a header of its
// own so that what only reads the options (comm/quantize.h's qgZ settings) need not include
// comm/communicator.h, which itself uses the quantizer.
#pragma once

#include <cstddef>

namespace zerodp {

struct CommOptions {
  // A collective that waits longer than this fails with CommTimeout.
  double timeout_seconds = 300.0;
  // Every collective first compares a fingerprint (kind, count, dtype, op or root, sequence
  // number) across ranks, so a rank calling another collective fails naming both instead
  // of hanging or mixing data. Free on the local backend (always on there); one small
  // extra exchange per collective under MPI.
  bool check_collectives = true;
  // Simulated interconnect (0 = off): each collective takes at least
  // bytes received / link_bandwidth + ring steps x link_latency on every rank, so a slow
  // network can be studied on one machine. Ring steps: N-1 for a reduce-scatter, all-gather
  // or broadcast, 2(N-1) for an all-reduce. A collective the link would make last longer
  // than timeout_seconds fails with CommTimeout as soon as its data has moved, without
  // waiting: no real collective that slow would complete either.
  double link_bandwidth = 0;  // bytes per second
  double link_latency = 0;    // seconds per step
  // Ranks per node: ranks node * T .. node * T + T - 1 share a node (docs/topology.md).
  // 0 = every rank on one node. The world must be a whole number of nodes. It decides what
  // the ledger counts as crossing nodes, and the shape of the two-level collectives.
  int node_ranks = 0;
  // Two-level reduce-scatter and all-gather (all-reduce is the two): with P = N / T nodes,
  // rank r = p * T + l (node p, local index l) exchanges across nodes only with the P - 1
  // ranks of its local index, so a rank's cross-node bytes drop from (N - T) * c_r * w to
  // (P - 1) * c_r * w. Reduce-scatter: inside node p, local rank l folds the node's T
  // inputs of every range (q, l) in local rank order in fp32 and rounds it to the dtype
  // (the node partial, what crosses nodes); then the owner folds the P partials of its
  // range in node order in fp32 (kSumInto: onto its accumulator), divides by N for kAvg
  // and rounds once. All-gather: across nodes among the ranks of one local index first,
  // then inside the node. A fixed order, the same on every backend for the same (P, T), but
  // not the flat rank-order fold, so not the canonical order (docs/determinism.md).
  // Broadcast and control stay flat. Off (flat) by default.
  bool two_level = false;
  // qgZ (ZeRO++'s quantized gradients; 0 = off, else 8 or 4): reduce-scatters with kSum,
  // kAvg or kSumInto carry int8 or int4 blocks of qgz_block elements with an fp32 scale each
  // (comm/quantize.h), always in two levels over nodes of T = node_ranks (the world when 0).
  // Rank r = p * T + l: inside node q, rank (q, l) folds, in local rank order in fp32, its
  // own input of range r exactly and each local peer's dequantized (each peer quantizes its
  // input's range r on its own, blocks from the range's start): node q's partial of range
  // r. Across nodes, r folds in node order in fp32 its own node's partial exactly and every
  // other node's dequantized (quantized as one buffer by the rank that computed it),
  // starting from zero (kSumInto: from its accumulator), divides by N for kAvg and rounds
  // once. Bytes: (T - 1) * sum_q Q(c_(q, l)) inside the node, (P - 1) * Q(c_r) across, with
  // Q(c) = quantized_bytes(c). An all-reduce's reduce-scatter half is quantized alike (its
  // all-gather is not); kMax is refused by both.
  int qgz_bits = 0;
  size_t qgz_block = 256;
  // The simulated link between nodes (0 = as link_bandwidth / link_latency). A flat ring
  // over several nodes has a hop between nodes at every step, and every step waits for its
  // slowest hop, so when the world spans nodes a collective takes at least
  // bytes / inter_node_bandwidth + steps x inter_node_latency.
  double inter_node_bandwidth = 0;
  double inter_node_latency = 0;
};

}  // namespace zerodp
