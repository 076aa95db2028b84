// The simulated network as one model: what the communicator waits (CommOptions' link fields)
// and what `zerodp estimate` forecasts are this code, so the model of time changes in one
// place (docs/topology.md, "The simulated link").
//
// Inside a node a ring step costs `latency` and a byte 1 / `bandwidth`; between nodes
// `inter_latency` and 1 / `inter_bandwidth`, each falling back to the link inside a node when
// 0. A flat exchange over several nodes runs wholly at the link between them (its ring
// crosses it every step); a two-level one runs its intra-node phase inside and its
// cross-node phase between. 0 everywhere is a free network: no wait at all.
#pragma once

namespace zerodp {

struct LinkModel {
  double bandwidth = 0;  // bytes per second inside a node
  double latency = 0;    // seconds per ring step inside a node
  double inter_bandwidth = 0;
  double inter_latency = 0;

  double between_bandwidth() const { return inter_bandwidth > 0 ? inter_bandwidth : bandwidth; }
  double between_latency() const { return inter_latency > 0 ? inter_latency : latency; }

  // `bytes` over `steps` ring steps inside a node.
  double inside_seconds(double bytes, double steps) const {
    double s = 0;
    if (bandwidth > 0) s += bytes / bandwidth;
    if (latency > 0) s += steps * latency;
    return s;
  }
  // A flat exchange: between nodes when it spans them.
  double flat_seconds(double bytes, double steps, bool spans_nodes) const {
    if (!spans_nodes) return inside_seconds(bytes, steps);
    double s = 0;
    if (between_bandwidth() > 0) s += bytes / between_bandwidth();
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
    if (between_bandwidth() > 0) s += cross / between_bandwidth();
    if (between_latency() > 0) s += cross_steps * between_latency();
    return s;
  }
};

}  // namespace zerodp
