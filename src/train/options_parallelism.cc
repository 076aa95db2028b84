// How the ranks split a run: stages, precision, batches, links, nodes, offload, a part of the
// option table (options.h).
#include <charconv>
#include <cmath>
#include <string>

#include <fmt/core.h>

#include "comm/world_shape.h"
#include "core/error.h"
#include "core/units.h"
#include "train/option_readers.h"
#include "train/options.h"

namespace zerodp {
namespace {

using nlohmann::json;
using Form = OptionSpec::Form;
using namespace option_readers;

constexpr std::string_view kParallelism = "Parallelism";

// Islands of one rank each: no gradient or parameter collective runs inside an island, so an
// option that shapes them, while `on`, has nothing to act on.
std::string_view inside_islands(const TrainConfig& c, bool on) {
  const bool one_rank = c.islands > 1 && !c.islands_in_turn && c.launch.ranks == c.islands;
  return unless(!(one_rank && on),
                "the --islands have one rank each, so no collective runs inside one; use islands "
                "of two or more ranks (more --ranks or fewer --islands)");
}

const OptionSpec kParallelismOptions[] = {
    {.key = "ranks",
     .section = kParallelism,
     .help = "Data-parallel ranks (local backend); estimate: a list of rank counts, e.g. 1,8,64",
     .commands = kBoth,
     .sweeps = true,
     .advice = "use 1 or more",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.launch.ranks = whole<int>(t, o); },
     .check =
         [](const TrainConfig& c, const OptionSpec& o) {
           if (c.launch.backend == Backend::kLocal) at_least(c.launch.ranks, 1, o);
         },
     .record = [](const TrainConfig& c) -> json { return c.launch.ranks; }},
    {.key = "backend",
     .section = kParallelism,
     .help = "local (threads) or mpi (under mpirun)",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec&) { c.launch.backend = parse_backend_flag(t); },
     .record = [](const TrainConfig& c) -> json { return backend_name(c.launch.backend); }},
    {.key = "ranks_per_process",
     .section = kParallelism,
     .help = "mpi: ranks each process runs as threads, reading each other's buffers in place; the "
             "world is mpirun's -np x this. Set it to --node-ranks to run one process per node "
             "(docs/topology.md)",
     .advice = "use 1 or more rank threads per MPI process",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.launch.ranks_per_process = whole<int>(t, o); },
     .check = [](const TrainConfig& c,
                 const OptionSpec& o) { at_least(c.launch.ranks_per_process, 1, o); },
     .record = [](const TrainConfig& c) -> json { return c.launch.ranks_per_process; }},
    {.key = "stage",
     .section = kParallelism,
     .help = "ZeRO stage 0..3; estimate: a list, or all",
     .commands = kBoth,
     .sweeps = true,
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           int v = -1;
           const auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
           if (ec != std::errc() || ptr != t.data() + t.size() || v < 0 || v > 3) {
             throw InvalidArgument(fmt::format(
                 "{} '{}' is not a ZeRO stage; use 0, 1, 2 or 3 (estimate: or all)", o.flag(), t));
           }
           c.stage = v;
         },
     .check = [](const TrainConfig& c, const OptionSpec&) { (void)Sharding::for_stage(c.stage); },
     .record = [](const TrainConfig& c) -> json { return c.stage; }},
    {.key = "precision",
     .section = kParallelism,
     .help = "bf16, fp16 (dynamic loss scaling) or fp32",
     .commands = kBoth,
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec&) { c.precision = parse_precision_flag(t); },
     .record = [](const TrainConfig& c) -> json { return precision_name(c.precision); }},
    {.key = "micro_batch",
     .section = kParallelism,
     .help = "Sequences per rank per micro-batch (train: default the size preset's; estimate: 1)",
     .commands = kBoth,
     .advice = "use 1 or more sequences",
     .shown = "-",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           c.micro_batch = whole<int>(t, o);
           if (c.micro_batch < 1 || c.micro_batch > (1 << 20)) o.refuse(t);
         },
     .check = [](const TrainConfig& c, const OptionSpec& o) { at_least(c.micro_batch, 1, o); },
     .record = [](const TrainConfig& c) -> json { return c.micro_batch; }},
    {.key = "grad_accum",
     .section = kParallelism,
     .help = "Micro-batches per rank per optimizer step (default 1; on a train resume, the "
             "checkpoint's micro-batches per step over --ranks, so the batch is kept)",
     .commands = kBoth,
     .advice = "use 1 or more",
     .shown = "-",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           c.grad_accum = whole<int>(t, o);
           // 0 is the configuration's "derive it", never the user's.
           if (c.grad_accum < 1) o.refuse(t);
         },
     .check = [](const TrainConfig& c, const OptionSpec& o) { at_least(c.grad_accum, 0, o); },
     .record = [](const TrainConfig& c) -> json { return c.grad_accum; }},
    {.key = "accumulate",
     .section = kParallelism,
     .help = "local (sum, reduce at the boundary) or reduce (every micro-batch, overlapping "
             "backward); default reduce at stages 2-3 or with --grad-accum 1, else local",
     .commands = kBoth,
     .shown = "-",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec&) {
           c.accumulate = parse_accumulate_flag(t);
           c.accumulate_default = false;
         },
     .record = [](const TrainConfig& c) -> json { return accumulate_name(c.accumulate); }},
    {.key = "invariant",
     .section = kParallelism,
     .help = "on: sum gradients in the one order that gives the same bits for every rank count "
             "dividing the micro-batches per step (needs --accumulate reduce; an fp32 "
             "accumulator of 4 bytes per owned element when --grad-accum > 1); off; auto: on "
             "under --accumulate reduce (docs/determinism.md)",
     .commands = kBoth,
     .shown = "auto",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec&) { c.invariant = parse_invariant_flag(t); },
     .record = [](const TrainConfig& c) -> json { return canonical_order(c) ? "on" : "off"; }},
    {.key = "initial_loss_scale",
     .section = kParallelism,
     .help = "fp16: the dynamic loss scale to start from (a power of two)",
     .advice = "use a power of two, e.g. 65536",
     .type = "NUMBER",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           c.initial_loss_scale = static_cast<float>(finite(t, o, 0, true));
         },
     .idle =
         [](const TrainConfig& c) {
           return unless(c.precision == Precision::kFP16,
                         "only fp16 scales its loss; use --precision fp16");
         },
     .quote = [](const TrainConfig& c) { return fmt::format("{:g}", c.initial_loss_scale); }},
    {.key = "checkpoint_activations",
     .section = kParallelism,
     .help = "Keep only each unit's input in forward and recompute the unit in backward",
     .commands = kBoth,
     .form = Form::kSwitch,
     .read = [](TrainConfig& c, const std::string&,
                const OptionSpec&) { c.checkpoint_activations = true; },
     .record = [](const TrainConfig& c) -> json { return c.checkpoint_activations; }},
    {.key = "prefetch",
     .section = kParallelism,
     .help = "Stage 3: units gathered ahead",
     .commands = kBoth,
     .advice = "use 0..8",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.prefetch = whole<int>(t, o); },
     .check =
         [](const TrainConfig& c, const OptionSpec& o) {
           if (c.prefetch < 0 || c.prefetch > 8) o.refuse(fmt::format("{}", c.prefetch));
         },
     .record = [](const TrainConfig& c) -> json { return c.prefetch; },
     .idle =
         [](const TrainConfig& c) {
           return unless(
               c.stage == 3,
               "it sets how many units stage 3 gathers ahead, and stages 0-2 gather none; use "
               "--stage 3");
         }},
    {.key = "memory_per_rank",
     .section = kParallelism,
     .help = "Per-rank memory budget, e.g. 80GB or 2GiB: train refuses a plan past it before "
             "allocating; estimate says which stages fit it",
     .commands = kBoth,
     .advice = "use a positive size, e.g. 80GB",
     .type = "SIZE",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.memory_per_rank = parse_bytes(t, o.flag()); },
     .check =
         [](const TrainConfig& c, const OptionSpec& o) {
           if (c.memory_per_rank && *c.memory_per_rank == 0) o.refuse("0");
         },
     .record = [](const TrainConfig& c) -> json {
       return c.memory_per_rank ? json(*c.memory_per_rank) : json();
     }},
    {.key = "collective_timeout",
     .section = kParallelism,
     .help = "A collective waiting longer fails, e.g. 300 or 30s",
     .advice = "use a positive duration, e.g. 300 or 30s",
     .type = "DURATION",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           // A collective takes some time even between threads: 1 ms is the least that means
           // "a hang", not "every collective".
           c.launch.comm.timeout_seconds = parse_seconds(t, o.flag(), 1e-3, kCollectiveTimeoutMax);
         },
     .record = [](const TrainConfig& c) -> json { return c.launch.comm.timeout_seconds; }},
    {.key = "check_collectives",
     .section = kParallelism,
     .help = "MPI: compare every collective's fingerprint across ranks first, so a mismatch "
             "fails naming both ranks (on/off; the local backend always checks)",
     .advice = "use on or off",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.launch.comm.check_collectives = on_off(t, o); },
     .record = [](const TrainConfig& c) -> json { return c.launch.comm.check_collectives; }},
    {.key = "link_bandwidth",
     .section = kParallelism,
     .help = "A network's bandwidth per rank, e.g. 10GB/s: train simulates it (each collective "
             "takes at least bytes / this); estimate prices the comm with it",
     .commands = kBoth,
     .type = "RATE",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.launch.comm.link_bandwidth = link_bandwidth(t, o); },
     .record = [](const TrainConfig& c) { return unless_zero(c.launch.comm.link_bandwidth); }},
    {.key = "link_latency",
     .section = kParallelism,
     .help = "Per ring step latency of each collective, e.g. 20us (simulated by train)",
     .commands = kBoth,
     .type = "DURATION",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.launch.comm.link_latency = link_latency(t, o); },
     .record = [](const TrainConfig& c) { return unless_zero(c.launch.comm.link_latency); }},
    {.key = "inter_node_bandwidth",
     .section = kParallelism,
     .help = "A slower link between nodes (needs --node-ranks; default: --link-bandwidth): a "
             "flat collective over several nodes runs at this rate, e.g. 1GB/s",
     .commands = kBoth,
     .type = "RATE",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.launch.comm.inter_node_bandwidth = link_bandwidth(t, o); },
     .record =
         [](const TrainConfig& c) { return unless_zero(c.launch.comm.inter_node_bandwidth); }},
    {.key = "inter_node_latency",
     .section = kParallelism,
     .help = "Per step latency between nodes (needs --node-ranks), e.g. 50us",
     .commands = kBoth,
     .type = "DURATION",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.launch.comm.inter_node_latency = link_latency(t, o); },
     .record = [](const TrainConfig& c) { return unless_zero(c.launch.comm.inter_node_latency); }},
    {.key = "node_ranks",
     .section = kParallelism,
     .help = "Ranks per node: consecutive ranks share a node, and the comm ledger counts the "
             "bytes that cross nodes apart (docs/topology.md); default: one node",
     .commands = kBoth,
     .advice = kNodeRanksAdvice,
     .type = "INT",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.launch.comm.node_ranks = whole<int>(t, o); },
     // 0 is the configuration's "one node", which leaving the flag out already says.
     .check =
         [](const TrainConfig& c, const OptionSpec& o) {
           const bool given = c.given && c.given->count("node_ranks") != 0;
           at_least(c.launch.comm.node_ranks, given ? 1 : 0, o);
         },
     .record = [](const TrainConfig& c) -> json {
       return c.launch.comm.node_ranks > 0 ? json(c.launch.comm.node_ranks) : json();
     }},
    {.key = "shard_within_node",
     .section = kParallelism,
     .help = "Stages 1-3 with --node-ranks T: shard the states over the T ranks of each node "
             "and keep a replica per node (HSDP): gathers stay inside the node, gradients "
             "cross nodes once per reduction as an all-reduce of the shard; states cost 1/T, "
             "not 1/N, per rank (docs/topology.md)",
     .commands = kBoth,
     .form = Form::kSwitch,
     .read = [](TrainConfig& c, const std::string&,
                const OptionSpec&) { c.shard_within_node = true; },
     .record = [](const TrainConfig& c) -> json { return c.shard_within_node; }},
    {.key = "hpz",
     .section = kParallelism,
     .help = "Stage 3 with --node-ranks: keep each node's copy of a unit's parameters sharded "
             "over its ranks after the forward's gather, so the backward's gather stays inside "
             "the node (ZeRO++'s hpZ; costs the params' bytes / T per rank)",
     .commands = kBoth,
     .form = Form::kSwitch,
     .read = [](TrainConfig& c, const std::string&, const OptionSpec&) { c.hpz = true; },
     .record = [](const TrainConfig& c) -> json { return c.hpz; },
     .idle = [](const TrainConfig& c) { return inside_islands(c, c.hpz); },
     .idle_refused_in = kTrainCommand},
    {.key = "qwz",
     .section = kParallelism,
     .help = "Stage 3: gather parameters as int8 blocks with one fp32 scale each, quantized "
             "from the owner's fp32 master (ZeRO++'s qwZ): about half the gathers' bytes, and "
             "the passes see quantized weights",
     .commands = kBoth,
     .form = Form::kSwitch,
     .read = [](TrainConfig& c, const std::string&, const OptionSpec&) { c.qwz = true; },
     .record = [](const TrainConfig& c) -> json { return c.qwz; }},
    {.key = "qwz_block",
     .section = kParallelism,
     .help = "Elements per quantization scale (--qwz)",
     .commands = kBoth,
     .advice = "use the elements per scale, 1 to 16777216 (default 4096)",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.qwz_block = quant_block(t, o); },
     .check = [](const TrainConfig& c,
                 const OptionSpec& o) { check_quant_block(static_cast<int64_t>(c.qwz_block), o); },
     .record = [](const TrainConfig& c) -> json { return c.qwz_block; },
     .idle =
         [](const TrainConfig& c) {
           return unless(c.qwz, "it sizes --qwz's blocks, and --qwz is off; add --qwz");
         }},
    {.key = "offload",
     .section = kParallelism,
     .help = "optimizer: keep the fp32 master weights and Adam moments in a scratch file per "
             "rank under --offload-dir, streamed through the update in 4 MiB pieces "
             "(ZeRO-Infinity's NVMe tier): memory holds params and grads only; the step pays "
             "reading and writing them (zerodp bench-io DIR measures the disk; "
             "docs/offload.md). optimizer,params (stage 3): each rank's parameter shard too, "
             "read from disk before each gather, so memory holds the gradients and the "
             "gathered units. none, optimizer or optimizer,params",
     .commands = kBoth,
     .type = "TIER",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec&) { c.offload = parse_offload(t); },
     .record = [](const TrainConfig& c) -> json { return offload_name(c.offload); }},
    {.key = "offload_dir",
     .section = kParallelism,
     .help = "Directory for --offload's scratch files (unlinked at once: nothing is left "
             "behind); use a disk, not tmpfs",
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.offload_dir = t; },
     .record = [](const TrainConfig& c) -> json { return c.offload_dir; },
     .idle =
         [](const TrainConfig& c) {
           return unless(c.offload != Offload::kNone,
                         "it holds --offload's scratch files, and --offload is none; add --offload "
                         "optimizer");
         }},
    {.key = "offload_piece",
     .section = kParallelism,
     .help = "Elements per staged piece of --offload (a multiple of 1024, of 2048 with params, "
             "of 4096 with --optimizer-states int8; 0 = 1048576, 4 MiB per fp32 array): larger "
             "pieces, longer sequential I/O, more staging memory",
     .advice = "use a multiple of 1024 elements, e.g. 1048576, or 0 for the default",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.offload_piece = whole<uint64_t>(t, o); },
     .check =
         [](const TrainConfig& c, const OptionSpec&) {
           if (c.offload_piece % 1024 != 0) {
             throw InvalidArgument(fmt::format(
                 "--offload-piece {} is not a multiple of 1024 elements (4 KiB, O_DIRECT's "
                 "block); use e.g. 1048576, or 0 for the default",
                 c.offload_piece));
           }
         },
     .record = [](const TrainConfig& c) -> json { return c.offload_piece; },
     .idle =
         [](const TrainConfig& c) {
           return unless(c.offload != Offload::kNone,
                         "it sizes --offload's staged pieces, and --offload is none; add --offload "
                         "optimizer");
         }},
    {.key = "offload_overlap",
     .section = kParallelism,
     .help = "Stages 0 and 3 with --offload: run the update on its own thread while the next "
             "step's forward starts on the units already updated (on/off; the same bits either "
             "way; pays with a spare core per rank, docs/offload.md; estimate hides up to a "
             "third of the compute behind the update's I/O)",
     .commands = kBoth,
     .advice = "use on or off",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.offload_overlap = on_off(t, o); },
     .record = [](const TrainConfig& c) -> json { return c.offload_overlap; },
     .idle =
         [](const TrainConfig& c) {
           if (c.offload == Offload::kNone) {
             return std::string_view(
                 "it overlaps --offload's update, and --offload is none; add --offload optimizer");
           }
           return unless(c.stage != 1 && c.stage != 2,
                         "stages 1 and 2 gather the updated shards after the whole update, so no "
                         "forward can start on a unit already updated; use --stage 0 or 3");
         }},
    {.key = "qgz",
     .section = kParallelism,
     .help = "Reduce gradients as int8 or int4 blocks with an fp32 scale each (at stage 0 the "
             "all-reduce's reduce-scatter half), inside each node then across nodes (ZeRO++'s "
             "qgZ), summed in fp32 at the owner; off, int8 or int4",
     .commands = kBoth,
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec&) { c.launch.comm.qgz_bits = parse_qgz_flag(t); },
     .record = [](const TrainConfig& c) -> json { return qgz_name(c.launch.comm.qgz_bits); },
     .idle = [](const TrainConfig& c) { return inside_islands(c, c.launch.comm.qgz_bits != 0); },
     .idle_refused_in = kTrainCommand},
    {.key = "qgz_block",
     .section = kParallelism,
     .help = "Elements per quantization scale (--qgz)",
     .commands = kBoth,
     .advice = "use the elements per scale, 1 to 16777216 (default 256)",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           c.launch.comm.qgz_block = static_cast<size_t>(quant_block(t, o));
         },
     .check =
         [](const TrainConfig& c, const OptionSpec& o) {
           check_quant_block(static_cast<int64_t>(c.launch.comm.qgz_block), o);
         },
     .record = [](const TrainConfig& c) -> json { return c.launch.comm.qgz_block; },
     .idle =
         [](const TrainConfig& c) {
           return unless(c.launch.comm.qgz_bits != 0,
                         "it sizes --qgz's blocks, and --qgz is off; add --qgz int8 (or int4)");
         }},
    {.key = "collectives",
     .section = kParallelism,
     .help = "flat: every rank exchanges with every rank; two-level (with --node-ranks): inside "
             "each node, then across nodes with one rank per node and local index, T times "
             "fewer bytes between nodes, in an order that depends on T (so not --invariant on; "
             "docs/topology.md)",
     .commands = kBoth,
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec&) { c.launch.comm.two_level = parse_collectives_flag(t); },
     .record = [](const TrainConfig& c) -> json {
       return collectives_name(c.launch.comm.two_level);
     },
     .idle = [](const TrainConfig& c) { return inside_islands(c, c.launch.comm.two_level); },
     .idle_refused_in = kTrainCommand},
};

}  // namespace

std::span<const OptionSpec> parallelism_option_table() { return kParallelismOptions; }

}  // namespace zerodp
