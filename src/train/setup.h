// What a run does before its first step, apart from the step loop: build the model the
// configuration names, check that every rank of this process fits its memory budget and
// the machine (preflight), check that every rank runs the same options, and time the GEMM
// peak MFU is measured against.
#pragma once

#include "comm/communicator.h"
#include "data/source.h"
#include "models/model.h"
#include "tensor/gemm.h"
#include "train/config.h"
#include "train/engine.h"

namespace zerodp {

// The model the configuration names, as its kind (train/model_kind.h) builds it; the custom
// kinds are built by the caller (ModelFactory), and asking for one here is an
// InvalidArgument.
Model build_model(const TrainConfig& c);

// One core's GEMM rate through the same gemm() training uses, in `compute`: a 512^3
// product, single threaded, repeated for about 0.1 s, the best of the runs. Measured once
// per process and compute.
double gemm_flops_per_core(GemmCompute compute);

// Before anything is allocated: what ranks my_rank.. of this process will hold (every rank
// on the local backend, its own under MPI) against --memory-per-rank and the machine's
// available memory. Throws OutOfMemory naming the stage or rank count that would fit.
void preflight(const TrainConfig& cfg, const DataSplits& data, const ModelFactory& make_model,
               int world, int my_rank);

// The first collective of a run: each resolved option's digest, compared across ranks.
// Throws InvalidArgument naming the first option that differs.
void check_same_config(const TrainConfig& cfg, Communicator& comm);

}  // namespace zerodp
