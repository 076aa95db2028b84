// TrainConfig: every resolved option of a training run, and the stage as three switches.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/launch.h"
#include "comm/world_shape.h"

namespace zerodp {

// What each rank keeps only its slice of ("the stage as three switches"; train/stage_plan.h is
// their one reader).
struct Sharding {
  bool optimizer_states = false;  // stage >= 1
  bool gradients = false;         // stage >= 2
  bool parameters = false;        // stage >= 3
  // Throws InvalidArgument for anything outside 0..3.
  static Sharding for_stage(int stage);
};

enum class Precision { kBF16, kFP16, kFP32 };
// What a rank keeps in its offload file (docs/offload.md): nothing; the optimizer's states
// (fp32 master, adam_m, adam_v); those and, at stage 3, its parameter shards.
enum class Offload { kNone, kOptimizer, kParams };
std::optional<Precision> parse_precision(std::string_view name);
// The same for a flag's value: throws InvalidArgument with the standard message, e.g.
// "--precision 'fp8' is unknown; use bf16, fp16 or fp32".
Precision parse_precision_flag(std::string_view text, std::string_view flag = "--precision");
std::string_view precision_name(Precision p);

// When micro-batch gradients meet the collective (docs/architecture.md, "Accumulation"):
//   kLocal:  sum locally in the full gradient buffer, reduce once at the boundary (least comm)
//   kReduce: reduce every micro-batch into the rank's shard (least memory)
enum class AccumulatePolicy { kLocal, kReduce };
std::optional<AccumulatePolicy> parse_accumulate(std::string_view name);
AccumulatePolicy parse_accumulate_flag(std::string_view text,
                                       std::string_view flag = "--accumulate");
std::string_view accumulate_name(AccumulatePolicy p);
// The policy when --accumulate is not given: reduce at stages 2-3 (they keep no full gradient
// buffer) and whenever a step has one micro-batch, where both policies reduce the same
// gradient once and reduce issues each unit's reduction as soon as its backward ends, so it
// overlaps the rest of backward (DDP's buckets); local otherwise (least comm).
// --invariant on (`invariant` true) asks for reduce everywhere.
AccumulatePolicy default_accumulate(int stage, int grad_accum,
                                    std::optional<bool> invariant = std::nullopt);
// --invariant's value: on/true, off/false, or auto (nullopt); InvalidArgument otherwise.
std::optional<bool> parse_invariant_flag(std::string_view text);
// --qgz: off (0), int8 (8) or int4 (4) (CommOptions::qgz_bits); InvalidArgument otherwise.
int parse_qgz_flag(std::string_view text);
std::string_view qgz_name(int bits);
// --collectives: flat (false) or two-level (true; CommOptions::two_level); InvalidArgument
// otherwise.
bool parse_collectives_flag(std::string_view text);
std::string_view collectives_name(bool two_level);

// A fault to inject (--inject KIND@STEP[:RANK]), for tests and demos of failure handling
// (docs/reliability.md). Rank defaults to 0.
struct Injection {
  enum class Kind { kThrow, kHang, kKill, kNan, kIo, kOom, kTerm, kSlowIo, kCommitIo, kSlowCommit };
  Kind kind = Kind::kThrow;
  int64_t step = 1;
  int rank = 0;
};
// Throws InvalidArgument naming the text and the accepted forms.
Injection parse_injection(std::string_view text);

struct TrainConfig {
  // Model.
  std::string model = "gpt";  // gpt | llama | mlp
  std::string size = "small";
  // gpt and llama, resolved from size + overrides.
  int layers = 0, heads = 0, embd = 0, seq_len = 0;
  // --vocab: the language model's vocabulary, at least the data's largest token + 1; 0 until
  // resolved (the preset's: the byte vocabulary, 256, but for llama 1.1b's 32,000).
  int vocab = 0;
  // llama only, 0 until resolved from the preset: key/value heads (dividing heads), SwiGLU's
  // hidden units, the rotary base (a whole number, as every published Llama's is) and RMSNorm's
  // eps (0: 1e-5).
  int kv_heads = 0, ffn_hidden = 0, rope_theta = 0;
  float norm_eps = 0;
  // --head: "untied" (the default and the only one built), or "tied", refused naming why.
  std::string head = "untied";
  int mlp_hidden = 256, mlp_layers = 2;
  // Data.
  std::string data = "kjv";
  std::string tokenizer;  // a SentencePiece .model that encodes --data's text; empty: bytes
  std::string cache_dir;  // empty = default
  // Parallelism.
  LaunchOptions launch;
  int stage = 0;
  Precision precision = Precision::kBF16;
  int micro_batch = 0;  // 0 = the size preset's
  // 0 = derived: 1 on a fresh start; on a resume, the checkpoint's global batch over this
  // run's ranks (refused when the ranks do not divide it).
  int grad_accum = 0;
  AccumulatePolicy accumulate = AccumulatePolicy::kLocal;
  // --accumulate was not given: resolve_config sets default_accumulate(stage, grad_accum)
  // once grad_accum is known.
  bool accumulate_default = false;
  // The canonical gradient order (docs/determinism.md): every micro-batch's gradient rounded
  // once and added, in global micro-batch order, to its owner's fp32 accumulator, divided
  // by the step's micro-batch count once. nullopt = on exactly when accumulate is reduce.
  std::optional<bool> invariant;
  int prefetch = 1;
  bool checkpoint_activations = false;
  // hpZ (stage 3, with --node-ranks): the forward's gather also leaves each rank its share
  // of the unit within its node, and the backward gathers that inside the node instead of
  // across nodes (docs/topology.md).
  bool hpz = false;
  // qwZ (stage 3): every world gather of parameters carries int8 blocks of qwz_block
  // elements with an fp32 scale each, quantized by the owner from its fp32 master and
  // dequantized on arrival (comm/quantize.h). Changes the weights the passes see.
  bool qwz = false;
  // Elements per quantization scale. DeepSpeed's quantizer aims for groups of about 4K.
  int qwz_block = 4096;
  // HSDP (with --node-ranks T, stages 1-3): states sharded over the T ranks of each node
  // and replicated across nodes; gradients reduce-scattered inside the node of the world's
  // sum (Communicator::node_reduce_scatter), parameters gathered inside the node.
  bool shard_within_node = false;
  // DiLoCo (docs/diloco.md): the world as `islands` islands of N / islands consecutive ranks,
  // each training on its own slice of every step's samples with its states sharded over its
  // ranks as the stage says, nothing but the per-step control exchange crossing islands; every
  // `outer_every` steps, and at the run's last step, the islands average their
  // pseudo-gradients (the global weights minus their own) in island order in fp32, an outer
  // Nesterov step (outer_lr, outer_momentum) moves the global weights, and every island
  // restarts from them, its AdamW moments kept. 1 = off (every rank one data-parallel world).
  int islands = 1;
  // Every island in turn on all the ranks (each rank holding every island's states): the
  // bits of the islands on ranks of their own, with the memory of I islands' states but one
  // rank's buffers, at I times the time per step. The world is then one island's ranks.
  bool islands_in_turn = false;
  int64_t outer_every = 50;
  float outer_lr = 0.7f;
  float outer_momentum = 0.9f;
  // Streaming DiLoCo (train/outer_step.h): the parameters in `fragments` fragments whose
  // rounds end in turn, F dividing H; each exchange merged `outer_delay` steps after it
  // starts (below H / F), overlapping the steps between, with the global weights weighing
  // `outer_mix` against the island's then. 1 and 0: DiLoCo.
  int fragments = 1;
  int64_t outer_delay = 0;
  float outer_mix = 0.5f;
  // Outer gradients across the column as int8 or int4 blocks of kOuterQuantBlock elements
  // (train/outer_step.h); 0 = fp32.
  int outer_quant = 0;
  // Offload (docs/offload.md): what a scratch file per rank under offload_dir holds instead of
  // memory, streamed through in pieces.
  Offload offload = Offload::kNone;
  std::string offload_dir = "/var/tmp";
  // Elements per staged piece, a multiple of 1024 (2048 with 16-bit parameters: their 2-byte
  // elements fill O_DIRECT's 4 KiB blocks at half the rate); 0 = kOffloadPiece (train/plan.h).
  uint64_t offload_piece = 0;
  // Stages 0 and 3: the update streams on its own thread, and the next step's forward waits
  // per unit for it rather than for the whole update (the same bits either way). Off by
  // default: on 2 cores the extra thread beside the GEMM threads starves the file's worker
  // as often as it helps (docs/offload.md has the measurements).
  bool offload_overlap = false;
  // Optimization.
  int64_t steps = 100;
  uint64_t seed = 1337;
  float lr = 1e-3f;
  std::string schedule = "cosine";
  int64_t warmup = -1;  // steps; -1 = 5 % of the steps with cosine, 0 with constant
  float min_lr_ratio = 0.1f;
  float clip = 1.0f;  // 0 = off
  float weight_decay = 0.1f;
  // Adam's moments in 8 bits (optim/moments8.h): blocks of codes with an fp32 scale each,
  // for tensors of kMomentMinNumel elements or more; the units' partitions are then cut on
  // the block grid (Partition::aligned) so no block spans two ranks.
  bool int8_moments = false;
  bool decay_all = false;
  // Evaluation and output.
  int64_t eval_every = 0;  // 0 = only at the end
  int eval_batches = 16;   // in all, shared among the ranks
  std::optional<uint64_t> memory_per_rank;
  std::string metrics_path;
  std::string report_path;
  std::string trace_path;  // Chrome trace-event JSON of every rank's spans; empty = off
  // The --config file the options came from: an input no output may overwrite. Not part
  // of the run's configuration (two ranks may read theirs from different places).
  std::string config_file;
  bool progress = true;
  // Checkpoints (docs/checkpoint_format.md). A run with a checkpoint_dir saves every
  // checkpoint_every steps (0 = never in between) and always at its last step.
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  int keep = 0;  // committed checkpoints kept; 0 = all
  // Save in the background (train/async_save.h): the step boundary copies the shard, a
  // writer thread writes it, a later boundary commits it. A save due while one is in
  // flight waits for it, or with checkpoint_skip_busy is skipped.
  bool checkpoint_async = false;
  bool checkpoint_skip_busy = false;
  // On a signal, how long the save in flight may still take: written in time it is
  // committed and the signal's step saved; else it is abandoned and the run ends at once.
  double checkpoint_signal_wait = 30;
  std::string resume;  // "" = a fresh start; "latest" = newest in checkpoint_dir; or a path
  // A fresh start takes its weights from this safetensors file instead of the init function
  // (train/initial_weights.h); a resume takes the checkpoint's. "" = the init function.
  std::string init_from;
  // checkpoint_dir is on each host's own disk, not one every host shares: each host's ranks
  // write their shards there, every host commits the step, and `--resume latest` takes the
  // newest step every host committed (docs/checkpoint_format.md, "Node-local storage").
  bool node_local_checkpoints = false;
  // Stop after this step although the schedule runs to `steps` (0 = run to the end): a job
  // in time slices, continued later with resume.
  int64_t stop_after = 0;
  // Reliability. Consecutive skipped steps (non-finite gradients) after which the run stops,
  // naming the first unit and rank with a bad value; 0 = never stop.
  int max_skips = 25;
  std::vector<Injection> inject;
  // Elastic restarts (local backend): a rank's failure reloads the latest checkpoint and
  // continues on the largest rank count that divides the step's micro-batches and is below
  // the ranks that ran, at most this many times (train/engine.h). 0 = a failure ends the run.
  int max_restarts = 0;
  // fp16: the dynamic loss scale to start from (a power of two, 1..2^24).
  float initial_loss_scale = 65536.0f;
  // Return the consolidated fp32 weights in TrainResult (tools and tests; costs 4Φ on rank 0).
  bool keep_final_weights = false;
  // The options the user set, as config_json's keys (from the command line or a --config
  // file); nullopt for a configuration built in code. It decides two rules: an option given
  // where its combination leaves it nothing to do is refused (check_idle_options), and a
  // resume takes the model's fields the user left out from the checkpoint (a configuration
  // built in code means every field as it stands).
  std::optional<std::set<std::string>> given;
};

// The ranges of the numeric options train and estimate share (core/units.h's bounded
// parsers print them in words). A simulated link slower than 1 KB/s, or with more than a
// second per ring step, studies no network anyone runs, and its waits would outlast any
// collective timeout; past a day no collective is still coming.
struct OptionRange {
  double min;
  double max;
};
inline constexpr OptionRange kLinkBandwidthRange{1e3, 1e13};  // bytes per second
inline constexpr OptionRange kLinkLatencyRange{0, 1};         // seconds per ring step
inline constexpr OptionRange kDiskBandwidthRange{1e6, 1e12};  // bytes per second
inline constexpr double kCollectiveTimeoutMax = 86400;        // seconds
// Elements per quantization scale (--qwz-block, --qgz-block): past 2^24 one fp32 scale spans
// a 64 MiB block, far beyond what either mode's error bound was measured at.
inline constexpr OptionRange kQuantBlockRange{1, 1 << 24};
// Elements per scale of a quantized outer gradient (--outer-quant): qgZ's default.
inline constexpr size_t kOuterQuantBlock = 256;

// The flag a config_json key names: "qwz_block" -> "--qwz-block".
std::string flag_of(std::string_view key);

// Streaming DiLoCo's fragments split the model's `params` elements: each must hold at least
// one, or the plan would build (and time) empty exchanges by the million. InvalidArgument.
void check_fragments(const TrainConfig& c, uint64_t params);
// Islands are nodes unless --node-ranks says otherwise: with --islands and no --node-ranks,
// node_ranks becomes world / islands (launch() makes the MPI world so, comm/launch.h).
void default_island_nodes(TrainConfig& c, int world);
// The islands' part of the world rule (run_check.h), which the planner asks too: --islands
// divides a world of `world` ranks unless the islands take turns, into islands that are whole
// nodes or a part of one. The rule, then its refusal (`named`: how it names the world).
bool islands_fit_world(const TrainConfig& c, int world);
void check_island_world(const TrainConfig& c, int world, WorldNamed named);

// --offload's value: "none", "optimizer" or "optimizer,params". Throws InvalidArgument naming
// the text and what is accepted.
Offload parse_offload(std::string_view text);
std::string_view offload_name(Offload o);

// Resolves size presets and defaults in place, then checks the run (check_run) and, on the
// local backend, its world of --ranks (check_world); throws InvalidArgument naming bad values.
void resolve_config(TrainConfig& config);

// Whether the run sums gradients in the canonical order: its bits are then the same for
// every rank count that divides its micro-batches per step (docs/determinism.md). --invariant
// auto: on when the policy is reduce and the collectives are flat.
bool canonical_order(const TrainConfig& c);
// The canonical order with more than one micro-batch per step: gradients are summed in an
// fp32 accumulator of the own range (at stages 2-3 the gradient buffer itself).
bool fp32_accumulator(const TrainConfig& c);

// Every resolved option, keyed by its flag name with '_' for '-' (the report's "config";
// a --config file may be one). Options left unset (no simulated link) are null.
nlohmann::json config_json(const TrainConfig& c);

}  // namespace zerodp
