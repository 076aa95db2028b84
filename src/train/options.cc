// The table of options; options.h is the contract.
#include "train/options.h"

#include <charconv>
#include <cmath>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <vector>

#include <fmt/core.h>

#include "core/error.h"
#include "core/units.h"
#include "train/option_readers.h"

namespace zerodp {

void OptionSpec::refuse(std::string_view value) const {
  throw InvalidArgument(
      fmt::format("{} {} is invalid; {}", flag(), value.empty() ? "''" : value, advice));
}

namespace {

using nlohmann::json;
using Form = OptionSpec::Form;

constexpr std::string_view kModel = "Model", kData = "Data", kParallelism = "Parallelism",
                           kOptimization = "Optimization", kCheckpoints = "Checkpoints",
                           kReliability = "Reliability", kOutput = "Output";
constexpr unsigned kBoth = kTrainCommand | kEstimateCommand;
// 2^24 rows: past any vocabulary trained today (256k), and V x C stays far inside a size_t.
constexpr int kMaxVocab = 1 << 24;

using namespace option_readers;

const OptionSpec kOptions[] = {
    // Model.
    {.key = "model",
     .section = kModel,
     .help = "gpt (GPT-2's shape), llama (RMSNorm, RoPE, SwiGLU, grouped-query attention) or mlp "
             "(Fashion-MNIST)",
     .commands = kBoth,
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.model = t; },
     .record = [](const TrainConfig& c) -> json { return c.model; }},
    {.key = "size",
     .section = kModel,
     .help = "gpt or llama preset: tiny, small (the default), medium, large; llama also 1.1b "
             "(TinyLlama's shape, docs/llama.md)",
     .commands = kBoth,
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.size = t; }},
    {.key = "layers",
     .section = kModel,
     .help = "transformer blocks (train: overrides the --size preset)",
     .commands = kBoth,
     .advice = "use 1 or more (omit it for the --size preset's)",
     .type = "INT",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.layers = shape(t, o); }},
    {.key = "heads",
     .section = kModel,
     .help = "attention (query) heads (train: overrides the preset)",
     .commands = kBoth,
     .advice = "use 1 or more (omit it for the --size preset's)",
     .type = "INT",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.heads = shape(t, o); }},
    {.key = "embd",
     .section = kModel,
     .help = "embedding width (train: overrides the preset)",
     .commands = kBoth,
     .advice = "use 1 or more (omit it for the --size preset's)",
     .type = "INT",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.embd = shape(t, o); }},
    {.key = "seq_len",
     .section = kModel,
     .help = "context length (train: overrides the preset)",
     .commands = kBoth,
     .advice = "use 1 or more (omit it for the --size preset's)",
     .type = "INT",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.seq_len = shape(t, o); }},
    {.key = "vocab",
     .section = kModel,
     .help = "vocabulary: the embedding's and the head's rows, at least the data's largest "
             "token + 1 (default: the preset's, 256 bytes but for llama 1.1b's 32000)",
     .commands = kBoth,
     .advice = "use 2 to 16777216 (omit it for the preset's)",
     .type = "INT",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           c.vocab = whole<int>(t, o);
           if (c.vocab < 2 || c.vocab > kMaxVocab) o.refuse(t);
         }},
    {.key = "mlp_hidden",
     .section = kModel,
     .help = "MLP hidden width",
     .advice = "use a width, 1 or more",
     .type = "INT",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.mlp_hidden = whole<int>(t, o); }},
    {.key = "mlp_layers",
     .section = kModel,
     .help = "MLP hidden layers",
     .advice = "use 0 or more",
     .type = "INT",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.mlp_layers = whole<int>(t, o); }},
    // Data.
    {.key = "data",
     .section = kData,
     .help = "kjv, fashion-mnist, synthetic, a text file PATH, or a DIR of token shards "
             "(zerodp prepare's or llm.c's)",
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.data = t; },
     .record = [](const TrainConfig& c) -> json { return c.data; }},
    {.key = "tokenizer",
     .section = kData,
     .help = "A SentencePiece .model that encodes --data's text (kjv or a file) into tokens "
             "as the run starts; the vocabulary is the tokenizer's unless --vocab is given",
     .type = "FILE",
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.tokenizer = t; },
     .record = [](const TrainConfig& c) -> json { return c.tokenizer; }},
    {.key = "cache_dir",
     .section = kData,
     .help = "Where prepared data is cached (default ~/.cache/zerodp)",
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.cache_dir = t; }},
    // Parallelism.
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
         }},
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
     .record = [](const TrainConfig& c) -> json { return c.prefetch; }},
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
     .advice = "use the ranks per node (1 or more), or leave it out",
     .type = "INT",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.launch.comm.node_ranks = whole<int>(t, o); },
     .check = [](const TrainConfig& c,
                 const OptionSpec& o) { at_least(c.launch.comm.node_ranks, 0, o); },
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
     .record = [](const TrainConfig& c) -> json { return c.hpz; }},
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
     .record = [](const TrainConfig& c) -> json { return c.qwz_block; }},
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
     .record = [](const TrainConfig& c) -> json { return c.offload_dir; }},
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
     .record = [](const TrainConfig& c) -> json { return c.offload_piece; }},
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
     .record = [](const TrainConfig& c) -> json { return c.offload_overlap; }},
    {.key = "qgz",
     .section = kParallelism,
     .help = "Reduce gradients as int8 or int4 blocks with an fp32 scale each (at stage 0 the "
             "all-reduce's reduce-scatter half), inside each node then across nodes (ZeRO++'s "
             "qgZ), summed in fp32 at the owner; off, int8 or int4",
     .commands = kBoth,
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec&) { c.launch.comm.qgz_bits = parse_qgz_flag(t); },
     .record = [](const TrainConfig& c) -> json { return qgz_name(c.launch.comm.qgz_bits); }},
    {.key = "qgz_block",
     .section = kParallelism,
     .help = "Elements per quantization scale (--qgz)",
     .commands = kBoth,
     .advice = "use the elements per scale, 1 to 16777216 (default 256)",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           c.launch.comm.qgz_block = static_cast<size_t>(quant_block(t, o));
         },
     .record = [](const TrainConfig& c) -> json { return c.launch.comm.qgz_block; }},
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
     }},
    // Optimization.
    {.key = "steps",
     .section = kOptimization,
     .help = "Optimizer steps (0: none; with --checkpoint-dir the starting weights are saved "
             "as step 0, e.g. those of --init-from)",
     .advice = "use 0 or more",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.steps = whole<int64_t>(t, o); },
     .check = [](const TrainConfig& c, const OptionSpec& o) { at_least<int64_t>(c.steps, 0, o); },
     .record = [](const TrainConfig& c) -> json { return c.steps; }},
    {.key = "seed",
     .section = kOptimization,
     .help = "Seed for init and data order (0..2^64-1)",
     .type = "INT",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.seed = parse_seed(t, o.flag()); },
     .record = [](const TrainConfig& c) -> json { return c.seed; }},
    {.key = "lr",
     .section = kOptimization,
     .help = "Peak learning rate",
     .advice = "use a positive number, e.g. 1e-3 or 3e-4",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.lr = static_cast<float>(finite(t, o, 0, true)); },
     .check =
         [](const TrainConfig& c, const OptionSpec& o) {
           if (!(c.lr > 0) || !std::isfinite(c.lr)) o.refuse(fmt::format("{}", c.lr));
         },
     .record = [](const TrainConfig& c) -> json { return c.lr; }},
    {.key = "schedule",
     .section = kOptimization,
     .help = "constant or cosine (with linear warmup)",
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.schedule = t; },
     .check =
         [](const TrainConfig& c, const OptionSpec&) {
           if (c.schedule != "constant" && c.schedule != "cosine") {
             throw InvalidArgument(
                 fmt::format("--schedule '{}' is unknown; use constant or cosine", c.schedule));
           }
         },
     .record = [](const TrainConfig& c) -> json { return c.schedule; }},
    {.key = "warmup",
     .section = kOptimization,
     .help = "Warmup steps, or auto: 5% of --steps with cosine, none with constant",
     .advice = "use auto or a whole number of steps, e.g. 100",
     .type = "INT|auto",
     .shown = "auto",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           c.warmup = t == "auto" ? -1 : whole<int64_t>(t, o);
           if (c.warmup < -1 || (c.warmup == -1 && t != "auto")) o.refuse(t);
         },
     .check = [](const TrainConfig& c, const OptionSpec& o) { at_least<int64_t>(c.warmup, -1, o); },
     .record = [](const TrainConfig& c) -> json { return c.warmup; }},
    {.key = "clip",
     .section = kOptimization,
     .help = "Clip the global gradient norm to this (0 = off)",
     .advice = "use 0 (off) or a positive norm, e.g. 1.0",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.clip = static_cast<float>(finite(t, o, 0, false)); },
     .check =
         [](const TrainConfig& c, const OptionSpec& o) {
           if (!(c.clip >= 0) || !std::isfinite(c.clip)) o.refuse(fmt::format("{}", c.clip));
         },
     .record = [](const TrainConfig& c) -> json { return c.clip; }},
    {.key = "optimizer_states",
     .section = kOptimization,
     .help = "Adam's moments: fp32, or int8 (blocks of 256 with an fp32 scale each, a "
             "dynamic-exponent code; tensors under 4096 elements stay fp32): about 2 bytes per "
             "parameter instead of 8, the same bits at every stage and rank count; the master "
             "weights stay fp32 (docs/optimizer_states.md)",
     .commands = kBoth,
     .advice = "use fp32 or int8",
     .type = "STATES",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           if (t != "fp32" && t != "int8") o.refuse(t);
           c.int8_moments = t == "int8";
         },
     .record = [](const TrainConfig& c) -> json { return c.int8_moments ? "int8" : "fp32"; }},
    {.key = "weight_decay",
     .section = kOptimization,
     .help = "AdamW decoupled weight decay",
     .advice = "use 0 (none) or a positive number, e.g. 0.1",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           c.weight_decay = static_cast<float>(finite(t, o, 0, false));
         },
     .check =
         [](const TrainConfig& c, const OptionSpec& o) {
           if (!(c.weight_decay >= 0) || !std::isfinite(c.weight_decay)) {
             o.refuse(fmt::format("{}", c.weight_decay));
           }
         },
     .record = [](const TrainConfig& c) -> json { return c.weight_decay; }},
    {.key = "decay_all",
     .section = kOptimization,
     .help = "Decay norms and biases too (as the PyTorch peer does)",
     .form = Form::kSwitch,
     .read = [](TrainConfig& c, const std::string&, const OptionSpec&) { c.decay_all = true; },
     .record = [](const TrainConfig& c) -> json { return c.decay_all; }},
    // Checkpoints.
    {.key = "checkpoint_dir",
     .section = kCheckpoints,
     .help = "Save sharded checkpoints here (DIR/step_NNNNNNNN/, DIR/latest); also at the last "
             "step",
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.checkpoint_dir = t; },
     .record = [](const TrainConfig& c) -> json { return c.checkpoint_dir; }},
    {.key = "checkpoint_every",
     .section = kCheckpoints,
     .help = "Save every K steps (0 = last only)",
     .advice = "use 0 or more steps",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.checkpoint_every = whole<int64_t>(t, o); },
     .check = [](const TrainConfig& c,
                 const OptionSpec& o) { at_least<int64_t>(c.checkpoint_every, 0, o); },
     .record = [](const TrainConfig& c) -> json { return c.checkpoint_every; }},
    {.key = "checkpoint_async",
     .section = kCheckpoints,
     .help = "Write checkpoints in the background: each rank copies its shard into staging "
             "memory (its size in the memory ledger) at the step, a thread writes it while "
             "training goes on, and a later step commits it once every rank's files are "
             "durable; the files are a synchronous save's (docs/checkpoint_format.md); "
             "estimate: add the staging to each row's need",
     .commands = kBoth,
     .form = Form::kSwitch,
     .read = [](TrainConfig& c, const std::string&,
                const OptionSpec&) { c.checkpoint_async = true; },
     .record = [](const TrainConfig& c) -> json { return c.checkpoint_async; }},
    {.key = "checkpoint_busy",
     .section = kCheckpoints,
     .help = "--checkpoint-async: a save due while the last is still being written waits for "
             "it (wait) or is skipped (skip; the report counts it)",
     .advice = "use wait or skip",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           if (t != "wait" && t != "skip") o.refuse(t);
           c.checkpoint_skip_busy = t == "skip";
         },
     .record = [](const TrainConfig& c) -> json {
       return c.checkpoint_skip_busy ? "skip" : "wait";
     }},
    {.key = "checkpoint_signal_wait",
     .section = kCheckpoints,
     .help = "--checkpoint-async: on SIGINT/SIGTERM, how long the save in flight may still "
             "take; written in time it is committed and the interrupted step saved, else it is "
             "abandoned (latest stays at the last committed) and the run ends at once",
     .advice = "use a duration of 0 or more, below --collective-timeout, e.g. 30 or 2.5s",
     .type = "DURATION",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           c.checkpoint_signal_wait = parse_seconds(t, o.flag(), 0, kCollectiveTimeoutMax);
         },
     .record = [](const TrainConfig& c) -> json { return c.checkpoint_signal_wait; }},
    {.key = "keep",
     .section = kCheckpoints,
     .help = "Committed checkpoints to keep, newest first (0 = all)",
     .advice = "use 0 (keep all) or more",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.keep = whole<int>(t, o); },
     .check = [](const TrainConfig& c, const OptionSpec& o) { at_least(c.keep, 0, o); },
     .record = [](const TrainConfig& c) -> json { return c.keep; }},
    {.key = "resume",
     .section = kCheckpoints,
     .help = "Continue from a checkpoint: a step directory, a checkpoint dir, or 'latest' (the "
             "newest in --checkpoint-dir); --steps stays the total. Any --ranks and --stage may "
             "load it",
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.resume = t; },
     .record = [](const TrainConfig& c) -> json { return c.resume; }},
    {.key = "init_from",
     .section = kCheckpoints,
     .help = "Start from these weights (fine-tuning): a safetensors file of the model's tensors "
             "by name, as zerodp export writes them or a PyTorch state dict saved under the "
             "same names; F32, BF16 or F16. Each rank reads only its own ranges; the report "
             "records the file's sha256. A resume takes the checkpoint's weights instead",
     .type = "FILE",
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.init_from = t; },
     .record = [](const TrainConfig& c) -> json { return c.init_from; }},
    {.key = "checkpoint_storage",
     .section = kCheckpoints,
     .help = "shared: --checkpoint-dir is one directory every host sees; node-local: each "
             "host's own disk (as DeepSpeed's node-local storage): a host's ranks write their "
             "shards there, every host commits the step, and --resume latest takes the newest "
             "step every host committed; it resumes on the same hosts",
     .read =
         [](TrainConfig& c, const std::string& t, const OptionSpec& o) {
           if (t != "shared" && t != "node-local") {
             throw InvalidArgument(fmt::format(
                 "{} '{}' is unknown; use shared (one directory every host sees) or node-local "
                 "(each host's own disk)",
                 o.flag(), t));
           }
           c.node_local_checkpoints = t == "node-local";
         },
     .record = [](const TrainConfig& c) -> json {
       return c.node_local_checkpoints ? "node-local" : "shared";
     }},
    {.key = "stop_after",
     .section = kCheckpoints,
     .help = "Stop after this step, the schedule still planned for --steps (a time slice; "
             "continue with --resume)",
     .advice = "use 0 (run to --steps) or a step",
     .shown = "-",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.stop_after = whole<int64_t>(t, o); },
     .check = [](const TrainConfig& c,
                 const OptionSpec& o) { at_least<int64_t>(c.stop_after, 0, o); },
     .record = [](const TrainConfig& c) -> json { return c.stop_after; }},
    // Reliability.
    {.key = "max_skips",
     .section = kReliability,
     .help = "Stop after this many consecutive skipped (non-finite) steps, naming the unit and "
             "rank (0 = never)",
     .advice = "use 0 (never stop) or more",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.max_skips = whole<int>(t, o); },
     .check = [](const TrainConfig& c, const OptionSpec& o) { at_least(c.max_skips, 0, o); },
     .record = [](const TrainConfig& c) -> json { return c.max_skips; }},
    {.key = "inject",
     .section = kReliability,
     .help = "Inject a fault, for tests and demos: KIND@STEP[:RANK], KIND one of throw, hang, "
             "kill, nan, io, slowio (that step's shard write 2 s slower), commitio (that step's "
             "commit fails on the rank that commits: 0, or a host's first), slowcommit (that "
             "commit 2 s "
             "slower), oom, term (a stop request, "
             "as SIGTERM on that rank alone) "
             "(repeatable)",
     .form = Form::kRepeated,
     .type = "KIND@STEP[:RANK]",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec&) { c.inject.push_back(parse_injection(t)); }},
    {.key = "max_restarts",
     .section = kReliability,
     .help = "Local backend: when a rank fails, reload the latest checkpoint and go on with the "
             "ranks left (the largest count below that divides the step's micro-batches, the "
             "batch kept), at most this many times (0 = a failure ends the run). Needs "
             "--checkpoint-dir and --checkpoint-every; under MPI relaunch with mpirun -np N' "
             "... --resume latest",
     .advice = "use 0 (a failure ends the run) or more",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.max_restarts = whole<int>(t, o); },
     .check = [](const TrainConfig& c, const OptionSpec& o) { at_least(c.max_restarts, 0, o); },
     .record = [](const TrainConfig& c) -> json { return c.max_restarts; }},
    // Output.
    {.key = "eval_every",
     .section = kOutput,
     .help = "Validation loss every K steps (0 = at the end only)",
     .advice = "use 0 (at the end only) or a number of steps",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.eval_every = whole<int64_t>(t, o); },
     .check = [](const TrainConfig& c,
                 const OptionSpec& o) { at_least<int64_t>(c.eval_every, 0, o); },
     .record = [](const TrainConfig& c) -> json { return c.eval_every; }},
    {.key = "eval_batches",
     .section = kOutput,
     .help = "Validation micro-batches in all, shared among the ranks",
     .advice = "use 0 (none) or more",
     .read = [](TrainConfig& c, const std::string& t,
                const OptionSpec& o) { c.eval_batches = whole<int>(t, o); },
     .check = [](const TrainConfig& c, const OptionSpec& o) { at_least(c.eval_batches, 0, o); },
     .record = [](const TrainConfig& c) -> json { return c.eval_batches; }},
    {.key = "metrics",
     .section = kOutput,
     .help = "Write one JSON line per step here",
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.metrics_path = t; }},
    {.key = "report",
     .section = kOutput,
     .help = "Write the run's report (docs/report.md) here",
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.report_path = t; }},
    {.key = "trace",
     .section = kOutput,
     .help = "Write a Chrome trace (chrome://tracing, Perfetto) of every rank's compute and "
             "collectives here; under MPI one file per rank, FILE.rankR.json",
     .read = [](TrainConfig& c, const std::string& t, const OptionSpec&) { c.trace_path = t; },
     .record = [](const TrainConfig& c) -> json { return c.trace_path; }},
    {.key = "no_progress",
     .section = kOutput,
     .help = "No progress output",
     .form = Form::kSwitch,
     .read = [](TrainConfig& c, const std::string&, const OptionSpec&) { c.progress = false; }},
};

}  // namespace

std::span<const OptionSpec> option_table() {
  // The llama's shape options live in options_llama.cc, DiLoCo's in options_islands.cc;
  // --help lists them after the rest of their section.
  static const std::vector<OptionSpec> all = [] {
    std::vector<OptionSpec> v(std::begin(kOptions), std::end(kOptions));
    for (const std::span<const OptionSpec> part : {llama_option_table(), island_option_table()}) {
      v.insert(v.end(), part.begin(), part.end());
    }
    return v;
  }();
  return all;
}

const OptionSpec& option_spec(std::string_view key) {
  for (const OptionSpec& o : option_table()) {
    if (o.key == key) return o;
  }
  throw std::logic_error(fmt::format("no option '{}' in the table", key));
}

void check_option_values(const TrainConfig& c, unsigned commands) {
  for (const OptionSpec& o : option_table()) {
    if ((o.commands & commands) != 0 && o.check != nullptr) o.check(c, o);
  }
}

}  // namespace zerodp
