// What a run does before its first step, apart from the step loop: build the model the
// configuration names, check that every rank of this process fits its memory budget and
// the machine (preflight), check that every rank runs the same options, and time the GEMM
// peaks MFU is measured against.
#pragma once

#include <optional>
#include <span>

#include "comm/communicator.h"
#include "data/source.h"
#include "models/model.h"
#include "tensor/gemm.h"
#include "train/config.h"

namespace zerodp {

// The model the configuration names, as its kind (train/model_kind.h) builds it; the custom
// kinds are built by the caller (ModelFactory), and asking for one here is an
// InvalidArgument.
Model build_model(const TrainConfig& c);

// One core's GEMM rate through the same gemm() training uses, in `compute`: a 512^3
// product, single threaded, repeated for about 0.1 s, the best of the runs. Measured once
// per process and compute.
double gemm_flops_per_core(GemmCompute compute);

// One core's GEMM rate on the model's own products, the second MFU denominator: each
// distinct shape of `shapes` (models/model.h's model_products for the run's micro-batch)
// timed through gemm() in `compute`, single threaded, the best run of the best shape. Fixed
// by method, so no run can tune it: operands of constant values in tight (unstrided) storage;
// each shape repeated for 0.4 s / (the shape count), at most 0.05 s, and at least twice (the
// first run pays oneDNN's primitive creation); a product of more than 2 GFLOP is timed on a
// part with M, then N, then K halved while above that and the side stays >= 256
// (single-threaded, gemm() runs a product that large as a series of tiles of at most
// 32 MFLOP, and K >= 256 keeps the kernel's depth, so the part runs at its rate; and no
// micro-batch makes the calibration's time or memory grow past a 2 GFLOP product's). The start-up
// cost is capped near 0.5 s (measured on an AMD EPYC: gpt small and medium 0.43-0.49 s in fp32 or
// bf16); past it only when the shapes' two runs alone take longer (gpt large, 63 shapes: 0.7 s).
// Measured once per process, compute and shape set. nullopt when `shapes` is empty (a caller's
// model that declares no products).
std::optional<double> gemm_flops_per_core(GemmCompute compute, std::span<const GemmShape> shapes);

// Before anything is allocated: what ranks my_rank .. my_rank + ranks_here - 1 of this
// process will hold (every rank on the local backend; under MPI the process's own, one or
// --ranks-per-process) against --memory-per-rank and the machine's available memory. Throws
// OutOfMemory naming the stage or rank count that would fit.
void preflight(const TrainConfig& cfg, const DataSplits& data, const ModelFactory& make_model,
               int world, int my_rank, int ranks_here = 1);

// The first collective of a run: each option's digest (config_json's, or a test's, as many
// as the object holds), compared across ranks. Throws InvalidArgument naming the first
// option that differs.
void check_same_options(const nlohmann::json& options, Communicator& comm);

}  // namespace zerodp
