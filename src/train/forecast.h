// The planner a user asks before a run: what a run of a TrainConfig would hold per rank, move
// per step and take per step at given links and disk. It answers from the functions the engine
// allocates and counts by (train/plan.h, train/stage_plan.h, comm/link_model.h) and from the
// configuration's own rules (canonical_order, default_accumulate), so `zerodp estimate` and a
// run cannot disagree on what a configuration is: estimate builds a TrainConfig per row
// (row_config) and prints what forecast() returns.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "models/unit.h"
#include "train/config.h"
#include "train/holdings.h"
#include "train/plan.h"

namespace zerodp {

// A disk's sequential bytes per second (zerodp bench-io measures them).
struct DiskBandwidth {
  double read = 0, write = 0;
};

// What prices a step in seconds; each is "not given" when empty.
struct StepInputs {
  std::optional<double> flops{};            // sustained FLOP/s per rank
  std::optional<double> compute_seconds{};  // or a measured step's compute per rank
  std::optional<double> bandwidth{}, latency{}, inter_bandwidth{}, inter_latency{};
  std::optional<DiskBandwidth> disk{};
  // Ranks whose offload files share one disk's bandwidth; default a node's ranks, else every
  // rank of the run (one machine).
  std::optional<int> ranks_per_disk{};
};

// Per-rank step time from the cost model: compute = model FLOPs / flops (or the given
// seconds); comm = bytes / bandwidth + ring steps x latency, split by when the engine issues
// it. Over several nodes the simulated link's rules apply (comm/link_model.h). Overlappable:
// reductions issued during backward (--accumulate reduce) and stage 3's prefetched gathers;
// serial: reductions at the step's boundary (--accumulate local) and stages 1-2's gather of
// the updated parameters. The step is max(compute, overlappable, forward + reductions) +
// serial: overlap assumed perfect where the engine allows it, none elsewhere, and the
// reductions issued during backward, which no forward can hide, start once the forward ends
// (held against the testbed, docs/topology.md: HSDP, whose only cross-node traffic is its
// reductions, was 0.63x of the measured step without this term).
struct StepTime {
  double compute = 0, comm_overlap = 0, comm_serial = 0;
  double forward = 0;          // the part of compute before the first reduction can start
  double backward_reduce = 0;  // the part of comm_overlap issued during backward
  double comm() const { return comm_overlap + comm_serial; }
  double serial() const { return compute + comm(); }
  double overlapped() const {
    return std::max({compute, comm_overlap, forward + backward_reduce}) + comm_serial;
  }
};

// The offloaded step: the in-memory step plus the update's I/O, except that at stages 0 and 3
// with --offload-overlap the next step's forward (a third of the compute: 2 of the 6 FLOPs per
// parameter and token) runs beside the update's I/O.
double offload_step_seconds(const StepTime& t, double io, int stage, bool overlap);
// What a step with offload waits on most: "compute", "comm" or "io".
std::string_view step_bound(const StepTime& t, double io);

struct Forecast {
  StateBytes states;                         // rank 0's (the largest ranges)
  uint64_t all_ranks = 0;                    // what memory keeps of every rank's states
  std::optional<TransientBytes> transients;  // with a model
  uint64_t need = 0;                         // states + transients
  CommBytes comm;                            // rank 0's per step
  std::optional<StepTime> time;              // given flops or compute seconds, with a model
  double io = 0;                             // the offload file's seconds per step, given a disk
  int disk_sharers = 0;                      // ranks sharing the disk's bandwidth, given a disk
  uint64_t checkpoint_staging = 0;           // --checkpoint-async's, rank 0's (in `need`)
  // --islands (train/outer_step.h), rank 0's: the outer state (in `need`), a round's bytes
  // (every fragment's exchange; `comm` holds its share per step, round / H), the largest
  // exchange's (the burst a link sees) and, given a link between nodes, a round's seconds
  // (in `time`: serial per step unless --outer-delay overlaps it) and the advice on H: the
  // smallest whose round takes at most a tenth of H steps.
  struct Outer {
    uint64_t state = 0;
    CommBytes round;  // all a round moves, the islands' own gathers included
    // What crosses islands: a round's, and the largest exchange's.
    CommBytes exchange_round, burst;
    std::optional<double> round_seconds;
    std::optional<int64_t> advised_every;
  };
  std::optional<Outer> outer;
};

// The run of `c` (resolved: its accumulation policy known) at c.launch.ranks ranks.
Forecast forecast(const TrainConfig& c, const PlannedModel& m, const StepInputs& in = {});

// One sentence for a budget error and estimate's no-fit line: rank 0's model states in memory
// (rank_holdings: the largest ranges) at every stage of `c` at `world` ranks, each stage's run
// as row_config makes it (with c.offload, its islands, 8-bit moments and HSDP), and what
// would make them fit: a stage marked (fits), or the fewest ranks with which stage 3's do, a
// bisection over the rank counts `c` can run at (whole nodes, whole islands).
// `name_offload`: when no stage's states fit and `c` offloads nothing, the least offload
// whose states would (callers that price offload by more than the states say it
// themselves).
std::string budget_advice(const TrainConfig& c, const PlannedModel& m, int world,
                          uint64_t budget_bytes, bool name_offload = true);

// What --offload `asked` keeps on disk at `stage`: parameters only at stage 3.
Offload stage_offload(Offload asked, int stage);

// The configuration train runs for one row of estimate's sweep: `asked` at `ranks` and
// `stage`, offloading `offload`, without what that stage has nothing to act on (hpZ and qwZ
// outside stage 3, HSDP at stage 0, parameters on disk outside stage 3, qwZ beside offload),
// and the stage's default accumulation where `asked` gave none.
TrainConfig row_config(const TrainConfig& asked, int ranks, int stage, Offload offload);

// A way to run stage 3 over nodes: ZeRO++'s switches and HSDP, as train takes them.
struct NodeMode {
  std::string name;
  std::string flags;  // what a flat run's command line gains; empty for flat
  int switches = 0;   // how many flags: ties go to the fewer
  CommModes modes;
};
// Flat, then every combination of hpZ, qwZ and qgZ on two-level collectives, fewer switches
// first, then HSDP.
std::vector<NodeMode> node_modes(int node_ranks, size_t qwz_block, size_t qgz_block);
bool quantizes(const CommModes& m);

// One mode's figures for rank 0 per step.
struct ModeForecast {
  NodeMode mode;
  CommBytes comm;
  uint64_t extra = 0;             // hpZ's node copy + qwZ's staging (+ HSDP's states)
  uint64_t need = 0;              // the stage-3 row's states (+ transients) + extra
  std::optional<double> seconds;  // at the links' bandwidths, when one is given
  bool allowed = true;            // false where --invariant on or --offload refuses it
};
// Every node mode for the stage-3 run of `stage3` (its own --hpz, --qwz, --qgz and
// --collectives set aside: each mode brings its own).
std::vector<ModeForecast> node_mode_forecasts(const TrainConfig& stage3, const PlannedModel& m,
                                              const StepInputs& in);

// The pick: the least seconds at the links (or, with none given, the fewest cross-node bytes)
// among the allowed modes that fit the budget, ties to the fewer flags. `fits` false: none
// fits and `pick` is the one whose need is least. `fastest`: the pick with no budget.
struct ModeChoice {
  size_t pick = 0;
  bool fits = true;
  size_t fastest = 0;
  bool by_seconds = false;
};
ModeChoice choose_mode(std::span<const ModeForecast> rows, std::optional<uint64_t> budget);

}  // namespace zerodp
