// resolve_config: what turns the options given into the run's configuration. The table of
// options is options.cc; the rules between them and with the world, run_check.cc.
#include <algorithm>

#include "train/config.h"
#include "train/model_kind.h"
#include "train/run_check.h"

namespace zerodp {

namespace {

// What the options leave to derive, before the rules read it: each default is completed
// only where it cannot hide a bad value (the rules refuse those after).
void complete_defaults(TrainConfig& c) {
  if (c.grad_accum == 0) c.grad_accum = 1;
  if (c.accumulate_default) {
    c.accumulate = default_accumulate(c.stage, c.grad_accum, c.invariant);
    c.accumulate_default = false;
  }
  if (c.islands > 1 && !c.islands_in_turn) c.launch.islands = c.islands;
  // Ranks whose write finished wait for the others in a collective, which must outlast it:
  // the default gives way to a short --collective-timeout, a value given does not.
  const bool wait_given = c.given && c.given->count("checkpoint_signal_wait") > 0;
  if (!wait_given) {
    c.checkpoint_signal_wait =
        std::min(c.checkpoint_signal_wait, c.launch.comm.timeout_seconds / 2);
  }
  if (c.warmup == -1) c.warmup = c.schedule == "cosine" ? c.steps / 20 : 0;
}

}  // namespace

void resolve_config(TrainConfig& c) {
  model_kind(c.model).resolve(c);
  complete_defaults(c);
  // A local world is --ranks, known now; an MPI rank checks its own once launched (engine).
  const bool local = c.launch.backend == Backend::kLocal;
  // Islands are nodes before the rules about nodes read them.
  if (local) default_island_nodes(c, c.launch.ranks);
  check_run(c);
  if (local) check_world(c, c.launch.ranks, WorldNamed::kRanks);
}

}  // namespace zerodp
