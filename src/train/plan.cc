#include "train/plan.h"

#include <algorithm>

#include <fmt/core.h>

#include "core/error.h"
#include "core/units.h"

namespace zerodp {
namespace {

// The same refusals as Partition's, made once per call rather than once per unit.
void check_rank(int world, int rank) {
  if (world < 1) {
    throw InvalidArgument(fmt::format("partition: world size {} is invalid; use 1 or more", world));
  }
  if (rank < 0 || rank >= world) {
    throw InvalidArgument(
        fmt::format("partition: rank {} is outside world of {} ranks", rank, world));
  }
}

// Rank `rank`'s element count in Partition(numel, world), in closed form: building the
// Partition costs O(world), which made every loop over ranks quadratic.
uint64_t own_count(uint64_t numel, int world, int rank) {
  const uint64_t n = static_cast<uint64_t>(world);
  return numel / n + (static_cast<uint64_t>(rank) < numel % n ? 1 : 0);
}

}  // namespace

StateBytes model_state_bytes(std::span<const uint64_t> unit_numel, int world, int stage,
                             Precision precision, int rank) {
  check_rank(world, rank);
  const Sharding sh = Sharding::for_stage(stage);
  const uint64_t w = precision == Precision::kFP32 ? 4 : 2;
  StateBytes b;
  for (uint64_t numel : unit_numel) {
    const uint64_t own = own_count(numel, world, rank);
    const uint64_t opt = sh.optimizer_states ? own : numel;
    b.params += (sh.parameters ? own : numel) * w;
    b.grads += (sh.gradients ? own : numel) * w;
    b.master += precision == Precision::kFP32 ? 0 : opt * 4;
    b.adam_m += opt * 4;
    b.adam_v += opt * 4;
  }
  return b;
}

StateBytes max_model_state_bytes(std::span<const uint64_t> unit_numel, int world, int stage,
                                 Precision precision) {
  // Balanced partitions give rank 0 the largest range of every unit.
  return model_state_bytes(unit_numel, world, stage, precision, 0);
}

StateBytes all_ranks_model_state_bytes(std::span<const uint64_t> unit_numel, int world, int stage,
                                       Precision precision) {
  check_rank(world, 0);
  const Sharding sh = Sharding::for_stage(stage);
  const uint64_t w = precision == Precision::kFP32 ? 4 : 2;
  const uint64_t n = static_cast<uint64_t>(world);
  StateBytes b;
  for (uint64_t numel : unit_numel) {
    const uint64_t opt = sh.optimizer_states ? numel : n * numel;
    b.params += (sh.parameters ? numel : n * numel) * w;
    b.grads += (sh.gradients ? numel : n * numel) * w;
    b.master += precision == Precision::kFP32 ? 0 : opt * 4;
    b.adam_m += opt * 4;
    b.adam_v += opt * 4;
  }
  return b;
}

PaperStateBytes paper_model_state_bytes(double phi, int world, int stage, Precision precision) {
  check_rank(world, 0);
  const Sharding sh = Sharding::for_stage(stage);
  const double w = precision == Precision::kFP32 ? 4 : 2;
  const double n = world;
  const auto per_rank = [n](double bytes, bool sharded) { return sharded ? bytes / n : bytes; };
  PaperStateBytes b;
  b.params = per_rank(w * phi, sh.parameters);
  b.grads = per_rank(w * phi, sh.gradients);
  b.master = precision == Precision::kFP32 ? 0 : per_rank(4 * phi, sh.optimizer_states);
  b.adam_m = per_rank(4 * phi, sh.optimizer_states);
  b.adam_v = b.adam_m;
  return b;
}

CommBytes comm_bytes_per_step(std::span<const uint64_t> unit_numel, int world, int stage,
                              Precision precision, int grad_accum, AccumulatePolicy policy,
                              int rank) {
  check_rank(world, rank);
  const Sharding sh = Sharding::for_stage(stage);
  const uint64_t w = precision == Precision::kFP32 ? 4 : 2;
  const uint64_t a = static_cast<uint64_t>(grad_accum);
  const uint64_t a_red = policy == AccumulatePolicy::kReduce ? a : 1;
  const uint64_t peers = static_cast<uint64_t>(world - 1);
  CommBytes b;
  for (uint64_t numel : unit_numel) {
    const uint64_t own = own_count(numel, world, rank);
    const uint64_t rs = peers * own * w;    // from each peer, its copy of my range
    const uint64_t ag = (numel - own) * w;  // every range but mine
    if (!sh.optimizer_states && !sh.gradients) {
      b.all_reduce += a_red * (rs + ag);
    } else {
      b.reduce_scatter += a_red * rs;
      b.all_gather += (sh.parameters ? 2 * a : 1) * ag;
    }
  }
  return b;
}

TransientBytes transient_bytes(const Model& model, const TransientPlan& p, int rank) {
  check_rank(p.world, rank);
  const Sharding sh = Sharding::for_stage(p.stage);
  const uint64_t w = p.precision == Precision::kFP32 ? 4 : 2;
  const BatchShape shape{.B = p.micro_batch, .T = p.seq_len};
  uint64_t max_numel = 0, max_own = 0, max_in = 0, max_scratch = 0, max_saved = 0, all_numel = 0;
  TransientBytes b;
  for (const auto& u : model) {
    max_numel = std::max<uint64_t>(max_numel, u->numel());
    max_own = std::max<uint64_t>(max_own, own_count(u->numel(), p.world, rank));
    max_in = std::max<uint64_t>(max_in, u->input_count(shape));
    max_scratch = std::max<uint64_t>(max_scratch, u->scratch_count(shape));
    max_saved = std::max<uint64_t>(max_saved, u->saved_count(shape));
    all_numel += u->numel();
    b.activations += 4 * u->input_count(shape);
    if (!p.checkpoint_activations) b.activations += 4 * u->saved_count(shape);
  }
  if (p.checkpoint_activations) b.activations += 4 * max_saved;
  b.activations += 4 * model.back()->output_count(shape);
  const uint64_t rows = static_cast<uint64_t>(p.micro_batch) * static_cast<uint64_t>(p.seq_len);
  b.activations += 4 * rows * (p.text ? 2 : 1) + 4 * p.features_per_sample * rows;
  b.workspace =
      4 * (max_numel * (p.precision == Precision::kFP32 ? 1 : 2) + 2 * max_in + max_scratch);
  if (sh.parameters) b.gathered = static_cast<uint64_t>(1 + p.prefetch) * max_numel * w;
  if (sh.gradients && p.policy == AccumulatePolicy::kLocal) b.grad_buckets = all_numel * w;
  if (p.policy == AccumulatePolicy::kReduce) {
    b.grad_buckets = 2 * max_numel * w;
    if (sh.optimizer_states || sh.gradients) b.comm_buffers = 2 * max_own * w;
  }
  return b;
}

std::string budget_advice(std::span<const uint64_t> unit_numel, int world, Precision precision,
                          uint64_t budget_bytes) {
  std::string s = fmt::format("model states per rank at {} ranks:", world);
  for (int stage = 0; stage <= 3; ++stage) {
    const uint64_t need = max_model_state_bytes(unit_numel, world, stage, precision).total();
    s += fmt::format(" stage {} {}{}", stage, format_bytes(static_cast<double>(need)),
                     need <= budget_bytes ? " (fits)" : "");
    s += stage < 3 ? "," : "";
  }
  const auto fits = [&](int stage, int ranks) {
    return max_model_state_bytes(unit_numel, ranks, stage, precision).total() <= budget_bytes;
  };
  const std::string tail =
      " (activations and buffers come on top; zerodp never changes stage by itself)";
  // Naming a rank count when the states already fit would send the user after the wrong
  // cause.
  if (fits(0, world))
    return s + "; every stage's states fit, so it is the activations and buffers that do not";
  if (fits(3, world)) return s + "; use a stage marked (fits)" + tail;
  int ranks = world;
  while (ranks < (1 << 20) &&
         max_model_state_bytes(unit_numel, ranks, 3, precision).total() > budget_bytes) {
    ranks = ranks * 2;
  }
  // Refine the doubling to the fewest ranks.
  int lo = std::max(world, ranks / 2), hi = ranks;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (max_model_state_bytes(unit_numel, mid, 3, precision).total() <= budget_bytes) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  if (max_model_state_bytes(unit_numel, hi, 3, precision).total() <= budget_bytes) {
    s += fmt::format("; stage 3 needs at least {} ranks for the states to fit", hi);
  } else {
    s += "; no rank count makes the states fit";
  }
  return s + tail;
}

double training_flops_per_token(double params, int layers, int seq_len, int embd) {
  return 6 * params + 12.0 * layers * seq_len * static_cast<double>(embd);
}

}  // namespace zerodp
