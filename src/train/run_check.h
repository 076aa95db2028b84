// The rules between a run's options, and between them and its world, each written once and
// asked by every command that takes those options: train (resolve_config, and each rank once
// an MPI launch has made the world) and estimate (the run it prices, and each of its rows'
// rank counts). An option's rules about itself are the table's (options.h: check, idle).
// Every refusal is InvalidArgument naming the flags, their values and what would work.
#pragma once

#include <span>

#include "comm/world_shape.h"
#include "train/config.h"
#include "train/options.h"

namespace zerodp {

// Every rule of the run's options that `command` takes, in this order: each option's value
// (the table's check); the islands; the summation order; nodes, HSDP and the stage-3 modes;
// offload; for train alone its checkpoints, schedule, restarts and processes; then the options
// given with nothing to act on (the table's idle). `c` has its defaults completed
// (resolve_config); its rank count is not read, which check_world checks once known.
void check_run(const TrainConfig& c, Command command = kTrainCommand);

// estimate's form: the run priced at each of `stages`. Refused only when no stage takes it,
// for the reason the highest stage gives (the stage that acts on the most options): a stage-3
// mode is refused only when no row is at stage 3.
void check_run_at_stages(const TrainConfig& c, std::span<const int> stages);

// The rules between the options and a world of `world` ranks: --islands divides it (unless
// the islands take turns) into islands that are whole nodes or a part of one, --node-ranks
// divides it, and --inject names a rank of it. `named`: how a refusal names the world.
void check_world(const TrainConfig& c, int world, WorldNamed named);
// Whether check_world takes a world of `world` ranks: the rank counts advice may name.
bool launchable(const TrainConfig& c, int world);
// What a world decides, then its check: the islands' nodes (default_island_nodes), check_world.
void resolve_world(TrainConfig& c, int world, WorldNamed named);

}  // namespace zerodp
