// What each rank must hold, computed before anything is allocated: the model-state bytes of
// the ZeRO table for any (N, stage, precision), exact for ragged partitions. The engine
// allocates exactly these (tests compare them with the ledger); budget errors use them to
// say which stage or rank count would fit.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data/source.h"
#include "models/unit.h"
#include "train/config.h"
#include "train/state_layout.h"

namespace zerodp {

struct StateBytes {
  uint64_t params = 0;
  uint64_t grads = 0;
  uint64_t master = 0;
  uint64_t adam_m = 0;
  uint64_t adam_v = 0;
  // Under --offload optimizer, master, adam_m and adam_v live in the rank's offload file
  // (and with optimizer,params the parameter shards): those are 0 here and `nvme` is the
  // file's size. Not part of total(), which is memory.
  uint64_t nvme = 0;
  uint64_t total() const { return params + grads + master + adam_m + adam_v; }
  // k copies (islands in turn hold every island's).
  StateBytes times(uint64_t k) const {
    return {params * k, grads * k, master * k, adam_m * k, adam_v * k, nvme * k};
  }
};

// The offload file's layout (train/offload.h): per unit, one region each for the 16-bit
// parameters (optimizer,params only), master (16-bit runs, or fp32 with parameters: there
// the master is the parameters), adam_m and adam_v of the optimizer range (fp32, or with
// --optimizer-states int8 one code byte per element), every region padded to whole
// kOffloadAlign-byte blocks so O_DIRECT can read any piece of it.
// (kOffloadAlign and the regions, the layout's entries in the file: train/state_layout.h.)
// Elements per staged piece (4 MiB of fp32 per array): large enough that one read or write
// runs at the disk's sequential speed, small enough that the staging stays a few MiB.
inline constexpr uint64_t kOffloadPiece = uint64_t{1} << 20;
// Every function below costs O(units) per call, whatever the world size, so a loop over
// ranks stays linear in the ranks.

// --optimizer-states int8 (optim/moments8.h): per unit, its tensors' element counts in order
// (Unit::tensors()), which decide which moments are quantized and where their blocks fall; a
// model known only by its units' sizes is one tensor per unit. The units' partitions are then
// Partition::aligned on kMomentBlock.
using UnitTensors = std::vector<std::vector<uint64_t>>;
UnitTensors unit_tensors(const Model& model);

// Rank `rank`'s persistent model states: params and grads in the run's precision (2 bytes,
// or 4 at fp32), fp32 master (none at fp32) and Adam moments; each full or the rank's
// partition range of every unit, as the stage's switches say. `fp32_accumulator` (the
// canonical order with A > 1, config.h): at stages 2-3 the grads are held in fp32.
// `offload`: what is counted in `nvme`, on disk, instead (kParams only at stage 3).
// `int8`: 8-bit moments (codes, one fp32 scale per block, small tensors fp32), aligned
// partitions.
StateBytes model_state_bytes(std::span<const uint64_t> unit_numel, int world, int stage,
                             Precision precision, int rank, bool fp32_accumulator = false,
                             Offload offload = Offload::kNone, const UnitTensors* int8 = nullptr);
// The same from a layout plan: what rank `index` of the `shards` ranks each unit is partitioned
// over holds of every unit (`tensors`: the units' tensors, which quantized moments and whole
// matrices need; null: one tensor a unit), and those bytes as the model-state categories.
LayoutBytes layout_bytes(const LayoutPlan& p, std::span<const uint64_t> unit_numel,
                         const UnitTensors* tensors, int shards, int index);
StateBytes state_bytes(const LayoutBytes& b);
// The largest over ranks (rank 0 holds the largest ranges).
StateBytes max_model_state_bytes(std::span<const uint64_t> unit_numel, int world, int stage,
                                 Precision precision, bool fp32_accumulator = false,
                                 Offload offload = Offload::kNone,
                                 const UnitTensors* int8 = nullptr);
// The sum over all `world` ranks of model_state_bytes, in closed form: the ranges of a unit
// add up to the unit, so a sharded state sums to one copy and a replicated one to `world`
// (8-bit moments too: their partitions are cut on the block grid, so no rank splits a block).
StateBytes all_ranks_model_state_bytes(std::span<const uint64_t> unit_numel, int world, int stage,
                                       Precision precision, bool fp32_accumulator = false,
                                       const UnitTensors* int8 = nullptr);

// The ZeRO paper's per-rank model-state bytes: every sharded state Φ/N, unrounded (real
// partitions are whole elements, which model_state_bytes counts). What the report sets the
// measured bytes against.
struct PaperStateBytes {
  double params = 0, grads = 0, master = 0, adam_m = 0, adam_v = 0;
  double total() const { return params + grads + master + adam_m + adam_v; }
};
PaperStateBytes paper_model_state_bytes(double phi, int world, int stage, Precision precision);

// Bytes rank `rank` receives per training step, by collective (the comm ledger's
// definitions), for A micro-batches under the accumulation policy: stage 0 all-reduces
// each unit A_red times; stages 1-2 reduce-scatter A_red times and all-gather once; stage 3
// reduce-scatters A_red times and all-gathers 2A times (A_red = A for kReduce, 1 for kLocal).
// `canonical` (the canonical order, with A > 1): stage 0 reduce-scatters A times and
// all-gathers the averaged gradient once instead.
// `modes`: the part of each that comes from peers on other nodes, as the comm ledger
// counts it (comm/ledger.h, docs/topology.md), for flat or two-level collectives; with hpZ,
// stage 3's backward gathers run inside the node (A of the 2A gathers cross no node).
struct CommModes {
  int node_ranks = 0;      // T; 0 = every rank on one node
  bool two_level = false;  // CommOptions::two_level
  bool hpz = false;        // TrainConfig::hpz
  // qwZ (TrainConfig::qwz): stage 3's world gathers carry int8 blocks of this many elements
  // with an fp32 scale each, quantized_bytes(c_r) per rank (comm/quantize.h); 0 = off.
  size_t qwz_block = 0;
  // qgZ (CommOptions::qgz_bits, 0 = off): every reduce-scatter carries int8 or int4 blocks
  // of qgz_block elements, in two levels over nodes of T (the world when node_ranks is 0).
  int qgz_bits = 0;
  size_t qgz_block = 256;
  // HSDP (TrainConfig::shard_within_node): units partitioned over the T ranks of a node,
  // reductions by node_reduce_scatter, gathers inside the node.
  bool shard_within_node = false;
  // The units' partitions cut on multiples of this (--optimizer-states int8: kMomentBlock).
  uint64_t grain = 1;
};
// A run's modes, from its options.
CommModes comm_modes_of(const TrainConfig& c);
// The ranks one copy of a run's states is sharded over: the world, under
// --shard-within-node a node's T, with --islands an island's; rank r holds range
// shard_index(c, r) of them.
int shard_ranks(const TrainConfig& c, int world);
int shard_index(const TrainConfig& c, int world, int rank);
// The islands whose states each rank holds: all of them with --islands-in-turn, else 1.
int hosted_islands(const TrainConfig& c);
// --islands (train/outer_step.h): I islands of n = N / I consecutive ranks. Islands are
// nodes unless --node-ranks T says otherwise: an island is then whole nodes (n % T == 0) or
// a part of one (T % n == 0). The node layouts of an island's communicator and of the column
// (a rank's peers of its index in every island): 0 = all on one node.
struct IslandLayout {
  int islands = 1;
  bool in_turn = false;       // every island in turn on the world's ranks (n = N)
  int fragments = 1;          // Streaming DiLoCo's (train/outer_step.h)
  int ranks = 0;              // n
  int inside_node_ranks = 0;  // within an island
  int across_node_ranks = 0;  // within a column
  // What a merge gathers again inside the island, per unit it touched: the params where each
  // rank holds the whole unit (stages 0-2; `param_bytes` an element), the fp32 master where
  // the optimizer updates it whole (stage 0 at 16 bits).
  bool gathers_params = false;
  bool gathers_master = false;
  // Offloaded, that master is in the file: gathered through a buffer of the largest unit.
  bool master_offloaded = false;
  uint64_t param_bytes = 2;
  // --outer-quant: 0 (fp32 all-reduce), 8 or 4 (blocks of kOuterQuantBlock all-gathered).
  int quant_bits = 0;
  uint64_t grain = 1;  // the units' partitions inside an island (CommModes::grain)
};
// InvalidArgument when the islands do not divide the world or do not fit the nodes. What the
// outer step allocates on a rank of it: outer_layout (train/outer_layout.h).
IslandLayout island_layout(const TrainConfig& c, int world);
// --checkpoint-async's staging on rank `rank` (train/async_save.h): the tensors of the shard
// files it writes, each unit's checkpoint_shard_bytes (train/state_layout.h: its own ranges'
// states, and on island 0's ranks the outer state), plus kStagingShardSlack per shard file;
// with --offload the bounce buffer (and the exchange in flight). 0 without
// --checkpoint-async, and on an HSDP replica, which writes no shard. The saver sizes its
// staging from the shards' tensors themselves; async_save_test holds the two equal.
// With --offload the states are read from the file through a bounce buffer of this many
// bytes (plus kOffloadAlign to align it): the staging.
inline constexpr uint64_t kCheckpointReadPiece = uint64_t{16} << 20;
// Staged in memory, each shard's bytes start where, modulo a 4 KiB block, the file's data
// section does, so that the writer sends them to the disk with O_DIRECT from the staging,
// uncopied (safetensors::Writer::bytes_in_place): up to this much room before each.
inline constexpr uint64_t kStagingShardSlack = 4096;
// `tensors`: the units' tensors, which 8-bit moments need (--optimizer-states int8).
uint64_t checkpoint_staging_bytes(std::span<const uint64_t> unit_numel, const TrainConfig& c,
                                  int world, int rank, const UnitTensors* tensors = nullptr);
struct CommBytes;
// What fragment f's exchange moves for rank `rank`: one fp32 all-reduce over its column of
// the fragment's part of its own ranges (quantized: an all-reduce of the block maxima inside
// the island and an all-gather of the payloads over the column), and the island's gathers of
// the units it touched.
CommBytes outer_step_bytes(std::span<const uint64_t> unit_numel, const IslandLayout& l, int rank,
                           int f = 0);
// Of those, what crosses islands: the column's all-reduce, or all-gather of the payloads.
CommBytes outer_exchange_bytes(std::span<const uint64_t> unit_numel, const IslandLayout& l,
                               int rank, int f = 0);
// A whole round's: every fragment's exchange (`exchange_only`: outer_exchange_bytes's).
CommBytes outer_round_bytes(std::span<const uint64_t> unit_numel, const IslandLayout& l, int rank,
                            bool exchange_only = false);
struct CommBytes {
  uint64_t all_reduce = 0;
  uint64_t reduce_scatter = 0;
  uint64_t all_gather = 0;
  uint64_t cross_all_reduce = 0;
  uint64_t cross_reduce_scatter = 0;
  uint64_t cross_all_gather = 0;
  uint64_t total() const { return all_reduce + reduce_scatter + all_gather; }
  uint64_t cross_total() const {
    return cross_all_reduce + cross_reduce_scatter + cross_all_gather;
  }
  CommBytes times(uint64_t k) const {
    return {all_reduce * k,       reduce_scatter * k,       all_gather * k,
            cross_all_reduce * k, cross_reduce_scatter * k, cross_all_gather * k};
  }
  CommBytes& operator+=(const CommBytes& o) {
    all_reduce += o.all_reduce;
    reduce_scatter += o.reduce_scatter;
    all_gather += o.all_gather;
    cross_all_reduce += o.cross_all_reduce;
    cross_reduce_scatter += o.cross_reduce_scatter;
    cross_all_gather += o.cross_all_gather;
    return *this;
  }
};
CommBytes comm_bytes_per_step(std::span<const uint64_t> unit_numel, int world, int stage,
                              Precision precision, int grad_accum, AccumulatePolicy policy,
                              bool canonical, int rank, const CommModes& modes = {});

// What the products of a --precision multiply in: bf16 runs multiply in bf16 (operands
// rounded, fp32 sums), as PyTorch's autocast does; fp16 runs keep fp32 products, since
// fp16 operands would overflow where bf16's range does not. The run's one decision of what
// products multiply in: it reaches every gemm() through the UnitWeights the trainer hands
// each unit, and it decides how units lay out what they save (Unit::saved_count).
GemmCompute compute_for(Precision p);

// What a rank allocates besides its model states, as the buffers the engine allocates:
// the one description both the engine (train/rank_trainer.cc allocates from it) and the
// planner (transient_bytes sums it) read, so the two cannot drift. Counts are elements.
struct TransientPlan {
  int world = 1;
  int stage = 0;
  Precision precision = Precision::kBF16;
  AccumulatePolicy policy = AccumulatePolicy::kLocal;
  int grad_accum = 1;
  bool canonical = false;  // the canonical order (canonical_order())
  int prefetch = 1;
  bool checkpoint_activations = false;
  int micro_batch = 1;
  int seq_len = 1;   // tokens per sample (1 for images)
  bool text = true;  // token inputs (else features_per_sample floats per sample)
  uint64_t features_per_sample = 0;
  int hpz_node_ranks = 0;            // hpZ's secondary copy over this many ranks (0 = off)
  size_t qwz_block = 0;              // qwZ's elements per scale (0 = off)
  Offload offload = Offload::kNone;  // the staging of the offload file's pieces
  uint64_t offload_piece = 0;        // elements per piece; 0 = kOffloadPiece
  uint64_t grain = 1;                // the units' partitions (CommModes::grain)
  bool int8_moments = false;         // --optimizer-states int8 (the file's code regions)
};
struct TransientLayout {
  // Activations, fp32 unless said: the stream between units (unit u's input, then the
  // head's output: units + 1 entries), what each unit saves for its backward (or one
  // recompute buffer with activation checkpointing), the micro-batch's inputs.
  std::vector<uint64_t> stream;
  std::vector<uint64_t> saved;
  uint64_t tokens = 0;   // int32; 0 for images
  uint64_t targets = 0;  // int32
  uint64_t features = 0;
  // Workspace, fp32: the widened weights (none at fp32, whose resident weights are read in
  // place), their gradient, the gradient flowing back (two, alternating), scratch. Each
  // sized for the largest unit.
  uint64_t widened_weights = 0;
  uint64_t weight_grads = 0;
  uint64_t input_grads = 0;  // each of the two
  uint64_t scratch = 0;
  // In the parameters' dtype (dtype_bytes each): stage 3's gathered units (1 + prefetch
  // slots of the largest unit), --accumulate local's full-size sums when gradients are
  // sharded (one per unit), --accumulate reduce's two buckets and, when the reduction is a
  // reduce-scatter, their reduced own ranges.
  uint64_t dtype_bytes = 2;
  int gathered_slots = 0;
  uint64_t gathered = 0;
  std::vector<uint64_t> accum_full;
  int buckets = 0;
  uint64_t bucket = 0;
  uint64_t reduced = 0;  // per bucket; 0 when buckets are all-reduced in place
  // fp32: the canonical order's accumulator of each unit's own range (A > 1 only, and at
  // stages 0-1: at stages 2-3 the grads buffer is the accumulator).
  std::vector<uint64_t> accumulator;
  // In the parameters' dtype: hpZ's secondary copy, each unit's range of local index
  // rank % T in Partition(numel, T); kept for the whole run.
  std::vector<uint64_t> hpz;
  // Bytes: qwZ's staging of every rank's int8 payload, one per gather slot, sized for the
  // largest unit (comm_buffers).
  uint64_t qwz_staging = 0;
  // --offload: two slots (one computed on while the other's I/O runs) of `offload_piece`
  // elements of every region of the file, `offload_element_bytes` per element; with
  // parameters, one more piece of them (`offload_bounce` bytes) that stage 3's gathers read
  // through; plus kOffloadAlign bytes to align them for O_DIRECT.
  uint64_t offload_element_bytes = 0;
  uint64_t offload_piece = 0;
  uint64_t offload_bounce = 0;
};
TransientLayout transient_layout(const Model& model, const TransientPlan& plan, int rank);

// The layout's bytes by ledger category (tests compare them with the ledger's peaks).
struct TransientBytes {
  uint64_t activations = 0;
  uint64_t workspace = 0;
  uint64_t gathered = 0;
  uint64_t grad_buckets = 0;
  uint64_t grad_accum = 0;
  uint64_t comm_buffers = 0;
  uint64_t hpz_params = 0;
  uint64_t offload_staging = 0;
  uint64_t total() const {
    return activations + workspace + gathered + grad_buckets + grad_accum + comm_buffers +
           hpz_params + offload_staging;
  }
};
TransientBytes transient_bytes(const TransientLayout& layout);
inline TransientBytes transient_bytes(const Model& model, const TransientPlan& plan, int rank) {
  return transient_bytes(transient_layout(model, plan, rank));
}

// Training FLOPs per token, the one definition MFU and the step-time estimate share: 6 per
// parameter (forward and backward) plus, for a transformer, attention's 12 x layers x T x C
// (the PaLM accounting; pass layers 0 for a model without attention). Recomputation under
// activation checkpointing is not counted.
double training_flops_per_token(double params, int layers = 0, int seq_len = 0, int embd = 0);

// The transient buffers a rank of `cfg` allocates on data `data`: what the preflight plans,
// the engine allocates and the forecast counts, from one place.
TransientPlan transient_plan(const TrainConfig& cfg, const DataSplits& data, int world);
// What one sample of `data` feeds the model besides tokens: an image's floats; 0 for text.
uint64_t features_per_sample(const DataSplits& data);
// The same for samples described without the data: `features_per_sample` 0 for text
// (cfg.seq_len tokens each), else an image of that many floats.
TransientPlan transient_plan(const TrainConfig& cfg, int world, uint64_t features_per_sample = 0);

// The ranks hpZ's node copy is partitioned over, with the states sharded over `shard_ranks`
// (a DiLoCo island's ranks, else the world's): a node's, or the island's when the island is
// part of a node. 0 without --hpz.
int hpz_node_ranks(const TrainConfig& cfg, int shard_ranks);

// The buffers stage 3's modes over nodes add, from the units' sizes alone (a model known only
// by its parameter count has no layers to lay out; transient_layout counts the same): hpZ's
// node copy of rank `rank` over nodes of `node_ranks`, and qwZ's staging of every rank's int8
// payload for one gather slot, sized for the largest unit.
uint64_t hpz_copy_bytes(std::span<const uint64_t> unit_numel, int node_ranks, int rank,
                        Precision precision);
uint64_t qwz_staging_bytes(std::span<const uint64_t> unit_numel, int world, size_t block,
                           uint64_t grain = 1);

}  // namespace zerodp
