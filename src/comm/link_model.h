// The simulated network as one model: what the communicator waits (CommOptions' link fields)
// and what `zerodp estimate` forecasts are this code, so the model of time changes in one
// place (docs/topology.md, "The simulated link").
//
// Inside a node a ring step costs `latency` and a byte 1 / `bandwidth`; between nodes a step
// costs `inter_latency`, and `inter_bandwidth` is the rate of a node's NIC, each falling back
// to the link inside a node when 0. The `nic_ranks` ranks of a node send their cross-node
// bytes through that one NIC at once, so a rank's `cross` bytes take cross x nic_ranks /
// inter_bandwidth: measured on hosts as network namespaces over TCP (docs/cluster.md), a
// per-rank wire underestimated the step 2-3x at 2 ranks per host. The bytes that stay inside
// the node go at `bandwidth`. A flat exchange over nodes waits every ring step at the latency
// between them; a two-level one pays T - 1 steps inside and P - 1 between. 0 everywhere is a
// free network: no wait at all.
#pragma once

namespace zerodp {

struct LinkModel {
  double bandwidth = 0;  // bytes per second inside a node
  double latency = 0;    // seconds per ring step inside a node
  double inter_bandwidth = 0;
  double inter_latency = 0;
  double nic_ranks = 1;  // ranks per node: they share its NIC

  double between_bandwidth() const { return inter_bandwidth > 0 ? inter_bandwidth : bandwidth; }
  double between_latency() const { return inter_latency > 0 ? inter_latency : latency; }

  // `bytes` over `steps` ring steps inside a node.
  double inside_seconds(double bytes, double steps) const {
    double s = 0;
    if (bandwidth > 0) s += bytes / bandwidth;
    if (latency > 0) s += steps * latency;
    return s;
  }
  // A flat exchange of `bytes`, `cross` of them from other nodes: inside one node at the
  // link there; over several, the cross-node bytes through the shared NIC.
  double flat_seconds(double bytes, double cross, double steps, bool spans_nodes) const {
    if (!spans_nodes) return inside_seconds(bytes, steps);
    double s = 0;
    if (bandwidth > 0) s += (bytes - cross) / bandwidth;
    if (between_bandwidth() > 0) s += cross * nic_ranks / between_bandwidth();
    if (between_latency() > 0) s += steps * between_latency();
    return s;
  }
  // A two-level exchange: `intra` bytes over `intra_steps` inside the node, then `cross`
  // bytes over `cross_steps` between nodes (added in that order, so every caller's sum is
  // the same bits).
  double two_level_seconds(double intra, double intra_steps, double cross,
                           double cross_steps) const {
    double s = 0;
    if (bandwidth > 0) s += intra / bandwidth;
    if (latency > 0) s += intra_steps * latency;
    if (between_bandwidth() > 0) s += cross * nic_ranks / between_bandwidth();
    if (between_latency() > 0) s += cross_steps * between_latency();
    return s;
  }
};

}  // namespace zerodp
