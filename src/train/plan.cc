#include "train/plan.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/core.h>

#include "comm/quantize.h"
#include "comm/world_shape.h"
#include "core/error.h"
#include "optim/moments8.h"
#include "train/outer_layout.h"
#include "train/stage_plan.h"

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
uint64_t own_count(uint64_t numel, int world, int rank, uint64_t grain) {
  return grain == 1 ? own_count(numel, world, rank) : own_range(numel, world, rank, grain).count();
}

// The sum of f(own_count(numel, world, k)) over the `count` ranks k = first, first + step, ...,
// in closed form: every count is numel / world, or one more below rank numel % world.
template <typename F>
uint64_t sum_over_ranks(uint64_t numel, int world, int first, int count, int step, F f,
                        uint64_t grain = 1) {
  if (grain > 1) {  // aligned partitions (--optimizer-states int8): rank by rank
    uint64_t sum = 0;
    for (int k = 0; k < count; ++k) sum += f(own_count(numel, world, first + k * step, grain));
    return sum;
  }
  const uint64_t n = static_cast<uint64_t>(world);
  const uint64_t rem = numel % n;
  const uint64_t k0 = static_cast<uint64_t>(first);
  const uint64_t all = static_cast<uint64_t>(count);
  const uint64_t big =
      k0 >= rem ? 0 : std::min(all, (rem - 1 - k0) / static_cast<uint64_t>(step) + 1);
  return big * f(numel / n + 1) + (all - big) * f(numel / n);
}

}  // namespace

StateBytes state_bytes(const LayoutBytes& b) {
  return {.params = b[MemCategory::kParams],
          .grads = b[MemCategory::kGrads],
          .master = b[MemCategory::kMaster],
          .adam_m = b[MemCategory::kAdamM],
          .adam_v = b[MemCategory::kAdamV],
          .nvme = b.file};
}

LayoutBytes layout_bytes(const LayoutPlan& p, std::span<const uint64_t> unit_numel,
                         const UnitTensors* tensors, int shards, int index) {
  check_rank(shards, index);
  if (tensors != nullptr && tensors->size() != unit_numel.size()) {
    throw std::logic_error(fmt::format("state layout: tensors of {} units for {} units",
                                       tensors->size(), unit_numel.size()));
  }
  LayoutBytes b;
  for (size_t i = 0; i < unit_numel.size(); ++i) {
    const UnitShape unit{
        .numel = unit_numel[i],
        .tensors = tensors != nullptr ? std::span((*tensors)[i]) : std::span<const uint64_t>()};
    b += unit_layout(p, unit, shards, index);
  }
  return b;
}

StateBytes model_state_bytes(std::span<const uint64_t> unit_numel, int world, int stage,
                             Precision precision, int rank, bool fp32_accumulator, Offload offload,
                             const UnitTensors* int8) {
  return state_bytes(
      layout_bytes(layout_plan(stage, precision, fp32_accumulator, offload, int8 != nullptr),
                   unit_numel, int8, world, rank));
}

UnitTensors unit_tensors(const Model& model) {
  UnitTensors out;
  for (const auto& u : model) {
    out.emplace_back();
    for (const TensorSpec& t : u->tensors()) out.back().push_back(t.numel);
  }
  return out;
}

StateBytes max_model_state_bytes(std::span<const uint64_t> unit_numel, int world, int stage,
                                 Precision precision, bool fp32_accumulator, Offload offload,
                                 const UnitTensors* int8) {
  // Balanced partitions give rank 0 the largest range of every unit (aligned ones too: the
  // first ranks hold the extra grain, the last grain is the short one).
  return model_state_bytes(unit_numel, world, stage, precision, 0, fp32_accumulator, offload, int8);
}

StateBytes all_ranks_model_state_bytes(std::span<const uint64_t> unit_numel, int world, int stage,
                                       Precision precision, bool fp32_accumulator,
                                       const UnitTensors* int8) {
  check_rank(world, 0);
  if (int8 != nullptr && int8->size() != unit_numel.size()) {
    throw std::logic_error(fmt::format("state layout: tensors of {} units for {} units",
                                       int8->size(), unit_numel.size()));
  }
  const LayoutPlan p =
      layout_plan(stage, precision, fp32_accumulator, Offload::kNone, int8 != nullptr);
  LayoutBytes b;
  for (size_t i = 0; i < unit_numel.size(); ++i) {
    const UnitShape unit{
        .numel = unit_numel[i],
        .tensors = int8 != nullptr ? std::span((*int8)[i]) : std::span<const uint64_t>()};
    b += all_ranks_layout(p, unit, world);
  }
  return state_bytes(b);
}

PaperStateBytes paper_model_state_bytes(double phi, int world, int stage, Precision precision) {
  check_rank(world, 0);
  const StagePlan sp = StagePlan::make(stage, AccumulatePolicy::kReduce);
  const double w = precision == Precision::kFP32 ? 4 : 2;
  const double n = world;
  const auto per_rank = [n](double bytes, StagePlan::Extent e) {
    return e == StagePlan::Extent::kOwn ? bytes / n : bytes;
  };
  PaperStateBytes b;
  b.params = per_rank(w * phi, sp.params);
  b.grads = per_rank(w * phi, sp.grads);
  b.master = precision == Precision::kFP32 ? 0 : per_rank(4 * phi, sp.optimizer);
  b.adam_m = per_rank(4 * phi, sp.optimizer);
  b.adam_v = b.adam_m;
  return b;
}

CommModes comm_modes_of(const TrainConfig& c) {
  return CommModes{.node_ranks = c.launch.comm.node_ranks,
                   .two_level = c.launch.comm.two_level,
                   .hpz = c.hpz,
                   .qwz_block = c.qwz ? static_cast<size_t>(c.qwz_block) : 0,
                   .qgz_bits = c.launch.comm.qgz_bits,
                   .qgz_block = c.launch.comm.qgz_block,
                   .shard_within_node = c.shard_within_node,
                   .grain = c.int8_moments ? kMomentBlock : 1};
}

int shard_ranks(const TrainConfig& c, int world) {
  if (c.islands > 1) return c.islands_in_turn ? world : world / c.islands;
  return c.shard_within_node && c.launch.comm.node_ranks > 0 ? c.launch.comm.node_ranks : world;
}

int shard_index(const TrainConfig& c, int world, int rank) {
  if (c.islands > 1) return c.islands_in_turn ? rank : rank % (world / c.islands);
  return c.shard_within_node && c.launch.comm.node_ranks > 0 ? rank % c.launch.comm.node_ranks
                                                             : rank;
}

int hosted_islands(const TrainConfig& c) {
  return c.islands > 1 && c.islands_in_turn ? c.islands : 1;
}

IslandLayout island_layout(const TrainConfig& c, int world) {
  const int k = c.islands;
  check_island_world(c, world, WorldNamed::kLaunched);
  const int n = c.islands_in_turn ? world : world / k;
  const int t = c.launch.comm.node_ranks > 0 ? c.launch.comm.node_ranks : n;
  return {.islands = k,
          .in_turn = c.islands_in_turn,
          .fragments = c.fragments,
          .ranks = n,
          .inside_node_ranks = n % t == 0 ? t : 0,
          .across_node_ranks = n % t == 0 ? 1 : t / n,
          .gathers_params = c.stage <= 2,
          .gathers_master = c.stage == 0 && c.precision != Precision::kFP32,
          .master_offloaded = c.offload != Offload::kNone,
          .param_bytes = c.precision == Precision::kFP32 ? 4u : 2u,
          .quant_bits = c.outer_quant,
          .grain = c.int8_moments ? kMomentBlock : 1};
}

uint64_t checkpoint_staging_bytes(std::span<const uint64_t> unit_numel, const TrainConfig& c,
                                  int world, int rank, const UnitTensors* tensors) {
  check_rank(world, rank);
  const int shards = shard_ranks(c, world);
  // HSDP: node 0's ranks write the one copy.
  if (!c.checkpoint_async || (c.islands == 1 && rank >= shards)) return 0;
  if (tensors != nullptr && tensors->size() != unit_numel.size()) {
    throw std::logic_error(fmt::format("checkpoint staging: tensors of {} units for {} units",
                                       tensors->size(), unit_numel.size()));
  }
  // Island 0's shard also holds the outer state (islands in turn: one of the rank's shards).
  const bool outer = c.islands > 1 && rank < shards;
  const LayoutPlan p = layout_plan(c);
  ShardUnitBytes shard;
  for (size_t i = 0; i < unit_numel.size(); ++i) {
    const UnitShape unit{
        .numel = unit_numel[i],
        .tensors = tensors != nullptr ? std::span((*tensors)[i]) : std::span<const uint64_t>()};
    shard += checkpoint_shard_bytes(p, unit, shards, shard_index(c, world, rank), outer,
                                    outer && c.outer_delay > 0);
  }
  // Offloaded, the states and the outer weights and momentum are read unit by unit through the
  // bounce buffer (the outer ones before a merge rewrites them); only the exchange in flight
  // is staged.
  if (c.offload != Offload::kNone) return kCheckpointReadPiece + kOffloadAlign + shard.pending;
  const auto k = static_cast<uint64_t>(hosted_islands(c));
  return k * (shard.states + kStagingShardSlack) + shard.outer + shard.pending;
}

CommBytes outer_round_bytes(std::span<const uint64_t> unit_numel, const IslandLayout& l, int rank,
                            bool exchange_only) {
  CommBytes round;
  for (int f = 0; f < l.fragments; ++f) {
    const CommBytes b = exchange_only ? outer_exchange_bytes(unit_numel, l, rank, f)
                                      : outer_step_bytes(unit_numel, l, rank, f);
    round.all_reduce += b.all_reduce;
    round.cross_all_reduce += b.cross_all_reduce;
    round.all_gather += b.all_gather;
    round.cross_all_gather += b.cross_all_gather;
  }
  return round;
}

CommBytes outer_exchange_bytes(std::span<const uint64_t> unit_numel, const IslandLayout& l,
                               int rank, int f) {
  CommBytes b;
  if (l.islands == 1 || l.in_turn) return b;  // in turn, the islands' exchange is in memory
  const int island = rank / l.ranks;
  // The column's nodes: islands sharing a node (across_node_ranks of them) exchange inside it.
  const int per_node = l.across_node_ranks > 0 ? l.across_node_ranks : l.islands;
  const int first = island / per_node * per_node;
  const OuterFragment share = outer_fragment(unit_numel, l, rank, f);
  if (l.quant_bits != 0) {
    // Every island's payload (the same size in a column) gathered over the column.
    b.all_gather = static_cast<uint64_t>(l.islands - 1) * share.payload;
    b.cross_all_gather = static_cast<uint64_t>(l.islands - per_node) * share.payload;
  } else {
    const uint64_t c = share.count;
    // An all-reduce is a reduce-scatter of Partition(c, I) and an all-gather back.
    const uint64_t mine = own_count(c, l.islands, island);
    const uint64_t rs = static_cast<uint64_t>(l.islands - 1) * mine;
    const uint64_t ag = c - mine;
    uint64_t near = 0;  // the all-gather's ranges held on this rank's node
    for (int i = first; i < first + per_node; ++i) {
      if (i != island) near += own_count(c, l.islands, i);
    }
    b.all_reduce = 4 * (rs + ag);
    b.cross_all_reduce = 4 * (static_cast<uint64_t>(l.islands - per_node) * mine + ag - near);
  }
  return b;
}

CommBytes outer_step_bytes(std::span<const uint64_t> unit_numel, const IslandLayout& l, int rank,
                           int f) {
  CommBytes b = outer_exchange_bytes(unit_numel, l, rank, f);
  if (l.islands == 1) return b;
  const int local = rank % l.ranks;
  const int t = l.inside_node_ranks > 0 ? l.inside_node_ranks : l.ranks;
  if (l.quant_bits != 0) {
    // The block maxima's all-reduce inside the island, one float a block.
    const uint64_t blocks = outer_fragment(unit_numel, l, rank, f).blocks;
    const uint64_t mine = own_count(blocks, l.ranks, local);
    uint64_t away = 0, away_ranks = 0;  // what the island's off-node ranks own, and they
    for (int q = 0; q < l.ranks; ++q) {
      if (q / t != local / t) {
        away += own_count(blocks, l.ranks, q);
        ++away_ranks;
      }
    }
    b.all_reduce += 4 * (static_cast<uint64_t>(l.ranks - 1) * mine + blocks - mine);
    b.cross_all_reduce += 4 * (away_ranks * mine + away);
  }
  // The island's gathers of every unit the fragment overlaps in the model.
  uint64_t total = 0;
  for (uint64_t numel : unit_numel) total += numel;
  const Range frag = balanced_range(total, l.fragments, f);
  const uint64_t lo = frag.begin, hi = frag.end;
  const uint64_t w = (l.gathers_params ? l.param_bytes : 0) + (l.gathers_master ? 4 : 0);
  uint64_t at = 0;
  for (uint64_t numel : unit_numel) {
    if (w > 0 && std::max(at, lo) < std::min(at + numel, hi)) {
      uint64_t others = 0, away = 0;  // elements of the island's other ranks, and off-node
      for (int q = 0; q < l.ranks; ++q) {
        if (q == local) continue;
        others += own_count(numel, l.ranks, q, l.grain);
        if (q / t != local / t) away += own_count(numel, l.ranks, q, l.grain);
      }
      b.all_gather += others * w;
      b.cross_all_gather += away * w;
    }
    at += numel;
  }
  if (l.in_turn) {  // every island's, in turn on the same ranks
    const auto k = static_cast<uint64_t>(l.islands);
    b.all_reduce *= k;
    b.cross_all_reduce *= k;
    b.all_gather *= k;
    b.cross_all_gather *= k;
  }
  return b;
}

namespace {

// HSDP's step (CommModes::shard_within_node): ranges of Partition(numel, T); each of the
// `reductions` is a node_reduce_scatter (inside the node (T - 1) c_l w, across an all-reduce
// of c_l split over the P nodes), each of the `gathers` a node_all_gather (inside the node
// only).
CommBytes hsdp_comm_bytes(std::span<const uint64_t> unit_numel, int world, int rank,
                          const CommModes& modes, uint64_t w, uint64_t reductions,
                          uint64_t gathers) {
  const int per_node = modes.node_ranks > 0 ? modes.node_ranks : world;
  const int nodes = world / per_node;
  const int local = rank % per_node;
  const int node = rank / per_node;
  CommBytes b;
  for (uint64_t numel : unit_numel) {
    const uint64_t own = own_count(numel, per_node, local, modes.grain);
    const uint64_t piece = own_count(own, nodes, node);
    const uint64_t cross = (static_cast<uint64_t>(nodes - 1) * piece + own - piece) * w;
    b.reduce_scatter += reductions * (static_cast<uint64_t>(per_node - 1) * own * w + cross);
    b.cross_reduce_scatter += reductions * cross;
    b.all_gather += gathers * (numel - own) * w;
  }
  return b;
}

}  // namespace

CommBytes comm_bytes_per_step(std::span<const uint64_t> unit_numel, int world, int stage,
                              Precision precision, int grad_accum, AccumulatePolicy policy,
                              bool canonical, int rank, const CommModes& modes) {
  const int node_ranks = modes.node_ranks;
  check_rank(world, rank);
  check_whole_nodes(node_ranks, world, WorldNamed::kLaunched);
  const int per_node = node_ranks > 0 ? node_ranks : world;
  const int first = rank / per_node * per_node;
  const StagePlan sp = StagePlan::make(stage, policy, canonical && grad_accum > 1);
  const uint64_t w = precision == Precision::kFP32 ? 4 : 2;
  const uint64_t a = static_cast<uint64_t>(grad_accum);
  // Reductions per step: one per micro-batch, or one at the boundary.
  const uint64_t reductions = sp.micro_batch_reduce != StagePlan::Reduce::kNone ? a : 1;
  const StagePlan::Reduce reduce = sp.micro_batch_reduce != StagePlan::Reduce::kNone
                                       ? sp.micro_batch_reduce
                                       : sp.boundary_reduce;
  // Gathers per step: before every forward and backward, or once after the update.
  const uint64_t gathers = sp.gather_before_compute                    ? 2 * a
                           : sp.gather_after_update || sp.gather_grads ? 1
                                                                       : 0;
  const uint64_t peers = static_cast<uint64_t>(world - 1);
  const uint64_t away = static_cast<uint64_t>(world - per_node);
  const bool levels = modes.two_level && per_node > 1 && per_node < world;
  // hpZ: of stage 3's 2A gathers, the backward's A gather the node's copy inside the node.
  const bool hpz = modes.hpz && sp.gather_before_compute;
  const uint64_t node_gathers = hpz ? a : 0;
  const uint64_t other_nodes = static_cast<uint64_t>(world / per_node - 1);
  // What a rank's range of c elements weighs on the wire in the world's gathers: c w, or
  // under qwZ (stage 3 only) its int8 blocks and their scales.
  const bool qwz = modes.qwz_block > 0 && sp.gather_before_compute;
  const auto payload = [&](uint64_t c) {
    return qwz ? static_cast<uint64_t>(quantized_bytes(
                     c, BlockQuant{.bits = QuantBits::kInt8, .block = modes.qwz_block}))
               : c * w;
  };
  const int nodes = world / per_node;
  const BlockQuant qgz{.bits = modes.qgz_bits == 4 ? QuantBits::kInt4 : QuantBits::kInt8,
                       .block = modes.qgz_block};
  const auto qgz_payload = [&](uint64_t c) {
    return static_cast<uint64_t>(quantized_bytes(c, qgz));
  };
  if (modes.shard_within_node && reduce == StagePlan::Reduce::kReduceScatter) {
    return hsdp_comm_bytes(unit_numel, world, rank, modes, w, reductions, gathers);
  }
  CommBytes b;
  // The unit's partition cuts on the grain (--optimizer-states int8); an all-reduce splits
  // the buffer its own way, balanced.
  const uint64_t g = reduce == StagePlan::Reduce::kAllReduce ? 1 : modes.grain;
  for (uint64_t numel : unit_numel) {
    const uint64_t own = own_count(numel, world, rank, g);
    uint64_t rs = peers * own * w;  // from each peer, its copy of my range
    const uint64_t all_payloads = sum_over_ranks(numel, world, 0, world, 1, payload, g);
    uint64_t ag = all_payloads - payload(own);  // every range but mine
    // The same from the peers on other nodes only.
    uint64_t rs_away = away * own * w;
    uint64_t ag_away = all_payloads - sum_over_ranks(numel, world, first, per_node, 1, payload, g);
    if (levels) {
      // The ranges of my local index on every node: what crosses nodes for me.
      uint64_t column = 0;
      for (int r = rank % per_node; r < world; r += per_node) {
        column += own_count(numel, world, r, g);
      }
      rs_away = other_nodes * own * w;  // each other node's partial of my range
      rs = static_cast<uint64_t>(per_node - 1) * column * w + rs_away;
      ag_away =
          sum_over_ranks(numel, world, rank % per_node, nodes, per_node, payload, g) - payload(own);
    }
    // qgZ quantizes every gradient reduce-scatter, and stage 0's all-reduce's half of one.
    if (modes.qgz_bits != 0) {
      rs_away = other_nodes * qgz_payload(own);
      rs = static_cast<uint64_t>(per_node - 1) *
               sum_over_ranks(numel, world, rank % per_node, nodes, per_node, qgz_payload, g) +
           rs_away;
    }
    if (reduce == StagePlan::Reduce::kAllReduce) {
      b.all_reduce += reductions * (rs + ag);
      b.cross_all_reduce += reductions * (rs_away + ag_away);
    } else {
      b.reduce_scatter += reductions * rs;
      b.cross_reduce_scatter += reductions * rs_away;
    }
    b.all_gather += (gathers - node_gathers) * ag;
    b.cross_all_gather += (gathers - node_gathers) * ag_away;
    if (hpz) {
      b.all_gather += node_gathers * (numel - own_count(numel, per_node, rank % per_node)) * w;
    }
  }
  return b;
}

GemmCompute compute_for(Precision p) {
  return p == Precision::kBF16 ? GemmCompute::kBF16 : GemmCompute::kFP32;
}

TransientLayout transient_layout(const Model& model, const TransientPlan& p, int rank) {
  check_rank(p.world, rank);
  const StagePlan sp = StagePlan::make(p.stage, p.policy, p.canonical && p.grad_accum > 1);
  const BatchShape shape{.B = p.micro_batch, .T = p.seq_len};
  const GemmCompute compute = compute_for(p.precision);
  TransientLayout l;
  uint64_t max_numel = 0, max_own = 0, max_saved = 0, max_opt = 0;
  for (const auto& u : model) {
    const uint64_t own = own_count(u->numel(), p.world, rank, p.grain);
    max_opt = std::max(max_opt, StagePlan::count(sp.optimizer, own, u->numel()));
    max_numel = std::max<uint64_t>(max_numel, u->numel());
    max_own = std::max<uint64_t>(max_own, own);
    max_saved = std::max<uint64_t>(max_saved, u->saved_count(shape, compute));
    l.input_grads = std::max<uint64_t>(l.input_grads, u->input_count(shape));
    l.scratch = std::max<uint64_t>(l.scratch, u->scratch_count(shape));
    l.stream.push_back(u->input_count(shape));
    if (!p.checkpoint_activations) l.saved.push_back(u->saved_count(shape, compute));
    if (sp.accumulate_full) l.accum_full.push_back(u->numel());
    if (sp.fp32_accumulator && !sp.grads_fp32) {
      l.accumulator.push_back(own);
    }
    if (p.hpz_node_ranks > 0 && sp.gather_before_compute) {
      l.hpz.push_back(own_count(u->numel(), p.hpz_node_ranks, rank % p.hpz_node_ranks));
    }
  }
  // Checkpointing keeps only each unit's input; one buffer serves every recompute.
  if (p.checkpoint_activations) l.saved.push_back(max_saved);
  l.stream.push_back(model.back()->output_count(shape));  // the head's: the loss
  const uint64_t rows = static_cast<uint64_t>(p.micro_batch) * static_cast<uint64_t>(p.seq_len);
  l.tokens = p.text ? rows : 0;
  l.targets = rows;
  l.features = p.features_per_sample * rows;
  const bool fp32 = p.precision == Precision::kFP32;
  l.widened_weights = fp32 ? 0 : max_numel;
  l.weight_grads = max_numel;
  l.dtype_bytes = fp32 ? 4 : 2;
  if (sp.gather_before_compute) {
    l.gathered_slots = 1 + p.prefetch;
    l.gathered = max_numel;
    if (p.qwz_block > 0) {
      std::vector<uint64_t> numel;
      for (const auto& u : model) numel.push_back(u->numel());
      l.qwz_staging = qwz_staging_bytes(numel, p.world, p.qwz_block, p.grain);
    }
  }
  if (p.offload != Offload::kNone) {
    const bool params = p.offload == Offload::kParams;
    const OffloadElement file = offload_element(layout_plan(
        /*stage=*/3, p.precision, /*fp32_accumulator=*/false, p.offload, p.int8_moments));
    l.offload_element_bytes = file.bytes;
    // A piece's elements fill whole blocks in every region.
    const uint64_t per_block = kOffloadAlign / file.narrowest;
    const uint64_t piece = p.offload_piece > 0 ? p.offload_piece : kOffloadPiece;
    l.offload_piece =
        std::max(per_block, std::min(piece, (max_opt + per_block - 1) / per_block * per_block));
    if (params) l.offload_bounce = l.offload_piece * (fp32 ? 4 : 2);
  }
  if (sp.micro_batch_reduce != StagePlan::Reduce::kNone) {
    // Two buckets: one reduces while the next unit's backward fills the other.
    l.buckets = 2;
    l.bucket = max_numel;
    // The accumulating reduce-scatter writes straight into the accumulator.
    if (sp.micro_batch_reduce == StagePlan::Reduce::kReduceScatter && !sp.fp32_accumulator) {
      l.reduced = max_own;
    }
  }
  return l;
}

TransientBytes transient_bytes(const TransientLayout& l) {
  const auto sum = [](const std::vector<uint64_t>& v) {
    uint64_t s = 0;
    for (uint64_t x : v) s += x;
    return s;
  };
  TransientBytes b;
  b.activations = 4 * (sum(l.stream) + sum(l.saved) + l.tokens + l.targets + l.features);
  b.workspace = 4 * (l.widened_weights + l.weight_grads + 2 * l.input_grads + l.scratch);
  b.gathered = static_cast<uint64_t>(l.gathered_slots) * l.gathered * l.dtype_bytes;
  b.grad_buckets =
      (sum(l.accum_full) + static_cast<uint64_t>(l.buckets) * l.bucket) * l.dtype_bytes;
  b.grad_accum = 4 * sum(l.accumulator);
  b.comm_buffers = static_cast<uint64_t>(l.buckets) * l.reduced * l.dtype_bytes +
                   static_cast<uint64_t>(l.gathered_slots) * l.qwz_staging;
  b.hpz_params = sum(l.hpz) * l.dtype_bytes;
  if (l.offload_piece > 0) {
    b.offload_staging =
        2 * l.offload_element_bytes * l.offload_piece + l.offload_bounce + kOffloadAlign;
  }
  return b;
}

double training_flops_per_token(double params, int layers, int seq_len, int embd) {
  return 6 * params + 12.0 * layers * seq_len * static_cast<double>(embd);
}

uint64_t hpz_copy_bytes(std::span<const uint64_t> unit_numel, int node_ranks, int rank,
                        Precision precision) {
  uint64_t elements = 0;
  for (uint64_t n : unit_numel) elements += own_count(n, node_ranks, rank % node_ranks);
  return elements * (precision == Precision::kFP32 ? 4 : 2);
}

uint64_t qwz_staging_bytes(std::span<const uint64_t> unit_numel, int world, size_t block,
                           uint64_t grain) {
  const BlockQuant q{.bits = QuantBits::kInt8, .block = block};
  uint64_t staging = 0;
  for (uint64_t n : unit_numel) {
    uint64_t bytes = 0;
    for (int k = 0; k < world; ++k) bytes += quantized_bytes(own_count(n, world, k, grain), q);
    staging = std::max(staging, bytes);
  }
  return staging;
}

int hpz_node_ranks(const TrainConfig& cfg, int shard_ranks) {
  if (!cfg.hpz) return 0;
  const int t = cfg.launch.comm.node_ranks;
  // An island and a node: one holds the other whole (IslandLayout), so the smaller is the
  // ranks that share both.
  return t > 0 ? std::min(t, shard_ranks) : shard_ranks;
}

uint64_t features_per_sample(const DataSplits& data) {
  const auto* images = std::get_if<ImageDataset>(&data.train);
  return images ? static_cast<uint64_t>(images->pixels_per_image()) : 0;
}

TransientPlan transient_plan(const TrainConfig& cfg, const DataSplits& data, int world) {
  return transient_plan(cfg, world, features_per_sample(data));
}

TransientPlan transient_plan(const TrainConfig& cfg, int world, uint64_t features_per_sample) {
  const bool text = features_per_sample == 0;
  return TransientPlan{.world = world,
                       .stage = cfg.stage,
                       .precision = cfg.precision,
                       .policy = cfg.accumulate,
                       .grad_accum = cfg.grad_accum,
                       .canonical = canonical_order(cfg),
                       .prefetch = cfg.prefetch,
                       .checkpoint_activations = cfg.checkpoint_activations,
                       .micro_batch = cfg.micro_batch,
                       .seq_len = text ? cfg.seq_len : 1,
                       .text = text,
                       .features_per_sample = features_per_sample,
                       .hpz_node_ranks = hpz_node_ranks(cfg, world),
                       .qwz_block = cfg.qwz ? static_cast<size_t>(cfg.qwz_block) : 0,
                       .offload = cfg.offload,
                       .offload_piece = cfg.offload_piece,
                       .grain = cfg.int8_moments ? kMomentBlock : 1,
                       .int8_moments = cfg.int8_moments};
}

}  // namespace zerodp
