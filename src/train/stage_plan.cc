// stage_plan.h is the contract: the one reader of the Sharding switches.
#include "train/stage_plan.h"

namespace zerodp {

StagePlan StagePlan::make(int stage, AccumulatePolicy policy, bool fp32_accumulator) {
  const Sharding sh = Sharding::for_stage(stage);
  const auto extent = [](bool sharded) { return sharded ? Extent::kOwn : Extent::kFull; };
  StagePlan p;
  p.stage = stage;
  p.policy = policy;
  p.params = extent(sh.parameters);
  p.grads = extent(sh.gradients);
  p.optimizer = extent(sh.optimizer_states);
  // A rank that updates only its own range needs only that range of the reduced gradient.
  const Reduce reduce =
      sh.optimizer_states || sh.gradients ? Reduce::kReduceScatter : Reduce::kAllReduce;
  if (policy == AccumulatePolicy::kReduce) {
    p.micro_batch_reduce = reduce;
  } else {
    p.boundary_reduce = reduce;
    p.accumulate_full = sh.gradients;
  }
  if (fp32_accumulator && policy == AccumulatePolicy::kReduce) {
    p.fp32_accumulator = true;
    p.micro_batch_reduce = Reduce::kReduceScatter;
    p.gather_grads = !sh.optimizer_states;
    p.grads_fp32 = sh.gradients;
  }
  p.gather_before_compute = sh.parameters;
  p.gather_after_update = sh.optimizer_states && !sh.parameters;
  return p;
}

}  // namespace zerodp
