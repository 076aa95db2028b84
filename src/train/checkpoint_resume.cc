// checkpoint_resume.h is the contract.
#include "train/checkpoint_resume.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <system_error>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "checkpoint/consolidate.h"
#include "core/sysinfo.h"
#include "optim/moments8.h"
#include "train/checkpoint_save.h"
#include "train/checkpoint_shards.h"
#include "train/model_kind.h"

namespace zerodp {
namespace {

// A model field a checkpoint's meta.json holds ("model": {...}) and the option that sets it:
// an int of TrainConfig, or (llama's RMSNorm eps) a float kept as its fp32 bits.
struct ModelField {
  std::string_view kind;
  std::string_view shape_key;
  std::string_view option;  // config_json's key
  int TrainConfig::*member = nullptr;
  float TrainConfig::*bits_of = nullptr;

  int64_t get(const TrainConfig& c) const {
    return member != nullptr ? c.*member : std::bit_cast<uint32_t>(c.*bits_of);
  }
  void set(TrainConfig& c, int64_t v) const {
    if (member != nullptr) {
      c.*member = static_cast<int>(v);
    } else {
      c.*bits_of = std::bit_cast<float>(static_cast<uint32_t>(v));
    }
  }
  // As the user writes it: the float, not its bits.
  std::string show(int64_t v) const {
    return member != nullptr ? std::to_string(v)
                             : fmt::format("{:g}", std::bit_cast<float>(static_cast<uint32_t>(v)));
  }
};

constexpr ModelField kModelFields[] = {
    {"gpt", "layers", "layers", &TrainConfig::layers},
    {"gpt", "heads", "heads", &TrainConfig::heads},
    {"gpt", "embd", "embd", &TrainConfig::embd},
    {"gpt", "seq_len", "seq_len", &TrainConfig::seq_len},
    {"gpt", "vocab", "vocab", &TrainConfig::vocab},
    {"llama", "layers", "layers", &TrainConfig::layers},
    {"llama", "heads", "heads", &TrainConfig::heads},
    {"llama", "kv_heads", "kv_heads", &TrainConfig::kv_heads},
    {"llama", "embd", "embd", &TrainConfig::embd},
    {"llama", "ffn", "ffn_hidden", &TrainConfig::ffn_hidden},
    {"llama", "seq_len", "seq_len", &TrainConfig::seq_len},
    {"llama", "vocab", "vocab", &TrainConfig::vocab},
    {"llama", "rope_theta", "rope_theta", &TrainConfig::rope_theta},
    {"llama", "norm_eps_fp32_bits", "norm_eps", nullptr, &TrainConfig::norm_eps},
    {"mlp", "hidden", "mlp_hidden", &TrainConfig::mlp_hidden},
    {"mlp", "hidden_layers", "mlp_layers", &TrainConfig::mlp_layers},
};

}  // namespace

void adopt_model_fields(TrainConfig& cfg, const ModelSource& from) {
  if (!cfg.given) return;
  const auto given = [&](std::string_view key) { return cfg.given->count(std::string(key)) > 0; };
  if (from.kind != cfg.model) {
    if (given("model")) {
      throw InvalidArgument(
          fmt::format("--model {} differs from {}'s model, {} ({}); leave --model out to {}",
                      cfg.model, from.source, from.kind, from.what, from.remedy));
    }
    // A flag that shapes the model the user did not name: it cannot shape this one.
    // One that shapes both (--layers) is compared with the file's value below.
    const auto shapes = [&](std::string_view key, std::string_view kind) {
      if (key == "size") return kind == kGptKind || kind == kLlamaKind;
      for (const ModelField& f : kModelFields) {
        if (f.option == key && f.kind == kind) return true;
      }
      return false;
    };
    for (const std::string& key : *cfg.given) {
      if (!shapes(key, cfg.model) || shapes(key, from.kind)) continue;
      throw InvalidArgument(fmt::format(
          "{}: {}'s model is {} ({}), but {} shapes a model of kind {}; leave it out "
          "to {}",
          from.flag, from.source, from.kind, from.what, flag_of(key), cfg.model, from.remedy));
    }
    cfg.model = from.kind;
  }
  for (const ModelField& f : kModelFields) {
    if (f.kind != from.kind) continue;
    const auto saved = from.shape.find(std::string(f.shape_key));
    if (saved == from.shape.end()) continue;  // checked by the caller: the layout needs it
    if (from.free_key == f.shape_key && given(f.option)) continue;
    const int64_t value = saved->second;
    if (given(f.option) && f.get(cfg) != value) {
      throw InvalidArgument(fmt::format("{} {} differs from {}'s {}, {} ({}); leave {} out to {}",
                                        flag_of(f.option), f.show(f.get(cfg)), from.source,
                                        from.key_prefix + std::string(f.shape_key), f.show(value),
                                        from.what, flag_of(f.option), from.remedy));
    }
    f.set(cfg, value);
  }
}

void adopt_checkpoint_model(TrainConfig& cfg, const std::filesystem::path& from) {
  const checkpoint::Meta m = checkpoint::read_meta(from);
  const std::string what = (from / "meta.json").string();
  if (const auto layout = checkpoint_model_layout(m, what)) {
    checkpoint::check_model(m, *layout, what);
  }
  if (!cfg.given) return;
  const ModelKind* kind = find_model_kind(m.model_kind);
  if (kind == nullptr || kind->build_from_shape == nullptr) return;
  const auto given = [&](std::string_view key) { return cfg.given->count(std::string(key)) > 0; };
  const ModelSource source{.kind = m.model_kind,
                           .shape = m.model_shape,
                           .what = what,
                           .flag = "--resume",
                           .source = "the checkpoint",
                           .key_prefix = "model.",
                           .remedy = "continue it",
                           .free_key = ""};
  if (m.model_kind != cfg.model) adopt_model_fields(cfg, source);  // the kind first: --size's
  // The preset decides the defaults that are not the model's (the micro-batch).
  if (const auto saved = m.config.find("size"); kind->sized && saved != m.config.end()) {
    if (given("size") && saved->second != cfg.size) {
      throw InvalidArgument(fmt::format(
          "--size {} differs from the checkpoint's size, {} ({}); leave --size out to continue "
          "it",
          cfg.size, saved->second, what));
    }
    cfg.size = saved->second;
  }
  // The run goes on with the micro-batch it had, unless told otherwise (the batch per step
  // is kept either way: keep_global_batch).
  if (const auto saved = m.config.find("micro_batch");
      !given("micro_batch") && saved != m.config.end()) {
    int v = 0;
    const auto [end, ec] =
        std::from_chars(saved->second.data(), saved->second.data() + saved->second.size(), v);
    if (ec == std::errc() && end == saved->second.data() + saved->second.size() && v >= 1) {
      cfg.micro_batch = v;
    }
  }
  adopt_model_fields(cfg, source);
}

void check_same_model(const TrainConfig& cfg, std::span<const checkpoint::UnitMeta> units,
                      const checkpoint::Checkpoint& ckpt) {
  const checkpoint::Meta& m = ckpt.meta();
  const std::string where = (ckpt.dir() / "meta.json").string();
  if (m.int8_moments && !parse_moment_code(m.moment_code)) {
    throw CorruptData(fmt::format(
        "{}: optimizer.moment_code is \"{}\", a code this build does not know; it reads {} and {}",
        where, m.moment_code, moment_code_name(MomentCode::kDecades),
        moment_code_name(MomentCode::kFloat8)));
  }
  if (m.units.size() != units.size()) {
    const std::string saved_size = m.config.count("size") ? m.config.at("size") : "";
    throw CorruptData(
        fmt::format("{}: a checkpoint of another model: {} units there ({}), {} in this run ({})",
                    where, m.units.size(), model_label(m.model_kind, saved_size), units.size(),
                    model_label(cfg.model, cfg.size)));
  }
  for (size_t i = 0; i < units.size(); ++i) {
    const checkpoint::UnitMeta& saved = m.units[i];
    const checkpoint::UnitMeta& mine = units[i];
    if (saved.name != mine.name || saved.numel != mine.numel ||
        saved.tensors.size() != mine.tensors.size()) {
      throw CorruptData(fmt::format(
          "{}: a checkpoint of another model: unit {} is \"{}\" with {} elements there, \"{}\" "
          "with {} in this run",
          where, i, saved.name, saved.numel, mine.name, mine.numel));
    }
    for (size_t k = 0; k < saved.tensors.size(); ++k) {
      const checkpoint::TensorMeta& t = mine.tensors[k];
      if (!(saved.tensors[k] == t)) {
        throw CorruptData(fmt::format(
            "{}: a checkpoint of another model: tensor {} of unit {} is {} {} there, {} {} here",
            where, k, mine.name, saved.tensors[k].name, fmt::join(saved.tensors[k].shape, "x"),
            t.name, fmt::join(t.shape, "x")));
      }
    }
  }
}

RunCounters load_checkpoint(const TrainConfig& cfg, const RankShards& shards, const RunData& data,
                            Communicator& comm, const checkpoint::Checkpoint& ckpt) {
  const checkpoint::Meta& m = ckpt.meta();
  if (m.islands != cfg.islands) {
    throw InvalidArgument(fmt::format(
        "{}: saved by {} island(s), this run has --islands {}; a DiLoCo run resumes with its "
        "islands (each holds its own states), so use --islands {}",
        ckpt.dir().string(), m.islands, cfg.islands, m.islands));
  }
  // DiLoCo's schedule is the checkpoint's: what is in flight depends on it.
  for (const char* key : {"outer_every", "fragments", "outer_delay"}) {
    const auto saved = m.config.find(key);
    const std::string mine = config_json(cfg)[key].dump();
    if (cfg.islands > 1 && saved != m.config.end() && saved->second != mine) {
      throw InvalidArgument(fmt::format(
          "{}: saved with {} {}, this run has {}; DiLoCo's schedule carries over a resume, so "
          "use {} {}",
          ckpt.dir().string(), flag_of(key), saved->second, mine, flag_of(key), saved->second));
    }
  }
  // Each rank reads, and checks, only the ranges it holds: one that finds a value no run
  // saves (checkpoint/format.h's saved_values) or cannot read its part fails every rank with
  // its message, so none goes on to wait for it at the first step.
  int failure = 0;  // 2: damaged, 1: unreadable
  std::string error;
  try {
    load_shards(shards, ckpt);
  } catch (const CorruptData& e) {
    failure = 2;
    error = e.what();
  } catch (const IoError& e) {
    failure = 1;
    error = e.what();
  }
  CommPhaseScope phase(comm.ledger(), CommPhase::kOther);
  if (const double worst = comm.max_control(failure); worst > 0) {
    const std::string first = first_error(comm, failure == worst ? error : std::string());
    if (worst == 2) throw CorruptData(first);
    throw IoError(first);
  }
  RunCounters counters{.optimizer = {.adam_step = m.adam_step, .scaler = std::nullopt},
                       .data = {m.data_epoch, m.data_step},
                       .samples_chain = m.samples_chain,
                       .samples_chain_from = m.samples_chain_from,
                       .lr_next = m.lr_next};
  // A checkpoint from before the chain was kept starts a new one at its step.
  if (m.samples_chain.empty()) {
    counters.samples_chain = std::string(64, '0');
    counters.samples_chain_from = m.step;
  }
  if (m.loss_scaler) {
    counters.optimizer.scaler = LossScalerState{.scale = static_cast<float>(m.loss_scaler->scale),
                                                .clean_steps = m.loss_scaler->clean_steps,
                                                .hysteresis_left = m.loss_scaler->hysteresis_left};
  }
  // The data cursor. With the same samples per step it is exact; otherwise the epoch's
  // samples consumed so far are kept and the step rounds up, so no sample of the epoch is
  // seen twice (the order is the same: it depends on the seed and the epoch only).
  const uint64_t k = data.samples_per_step;
  SamplerPosition& pos = counters.data;
  if (m.data_identity != data.identity) {
    const auto named = [](const std::string& id) {
      if (id.empty()) return std::string("data held in memory (kjv, synthetic or a text file)");
      if (id.starts_with("text ")) return id;  // encoded by --tokenizer: data/source.cc
      return fmt::format("the token shard set of digest {}", id.substr(0, 16));
    };
    throw InvalidArgument(fmt::format(
        "{}: trained on {}; this run's --data {} is {}; use the data the checkpoint was "
        "trained on",
        ckpt.dir().string(), named(m.data_identity), cfg.data, named(data.identity)));
  }
  if (m.dataset_size != data.dataset_size) {
    throw InvalidArgument(fmt::format(
        "{}: saved with a training set of {} samples, this run's has {}; use the same --data "
        "and sequence length",
        ckpt.dir().string(), m.dataset_size, data.dataset_size));
  }
  if (m.samples_per_step != k) {
    const uint64_t consumed = m.data_step * m.samples_per_step;
    pos.step = (consumed + k - 1) / k;
  }
  if (pos.step >= data.steps_per_epoch) pos = {pos.epoch + 1, 0};
  return counters;
}

// A step as a checkpoint's history keeps it: what the training determines, no timings.
checkpoint::StepHistory history_of(const StepRecord& r) {
  return {.step = r.step,
          .loss = r.loss,
          .lr = r.lr,
          .grad_norm = r.grad_norm,
          .grad_norm_clipped = r.grad_norm_clipped,
          .loss_scale = r.loss_scale,
          .skipped = r.skipped,
          .tokens = r.tokens,
          .val_loss = r.val_loss,
          .outer = r.outer};
}

StepRecord record_of(const checkpoint::StepHistory& h) {
  StepRecord r;
  r.step = h.step;
  r.loss = h.loss;
  r.lr = h.lr;
  r.grad_norm = h.grad_norm;
  r.grad_norm_clipped = h.grad_norm_clipped;
  r.loss_scale = h.loss_scale;
  r.skipped = h.skipped;
  r.tokens = h.tokens;
  r.val_loss = h.val_loss;
  r.outer = h.outer;
  return r;
}

std::optional<checkpoint::Checkpoint> open_resume_point(Communicator& comm, const TrainConfig& cfg,
                                                        const std::filesystem::path& local) {
  namespace ck = checkpoint;
  if (local.empty()) return std::nullopt;
  if (!cfg.node_local_checkpoints) return ck::Checkpoint(local);
  if (cfg.resume != "latest") return ck::Checkpoint(local, host_name());
  CommPhaseScope phase(comm.ledger(), CommPhase::kOther);
  std::vector<uint64_t> mine;
  for (const auto& dir : ck::list_checkpoints(cfg.checkpoint_dir)) {
    mine.push_back(ck::read_meta(dir).step);
  }
  // This rank's newest step at or below `at` (-1: none).
  const auto newest_upto = [&](double at) {
    double best = -1;
    for (uint64_t s : mine) {
      if (const auto d = static_cast<double>(s); d <= at) best = std::max(best, d);
    }
    return best;
  };
  // The newest step every rank holds: each proposes its newest at or below the candidate and
  // the least proposal is the next candidate, until all propose it (it only falls).
  double step = newest_upto(1e300);
  while (true) {
    const double agreed = -comm.max_control(-step);
    const double next = newest_upto(agreed);
    if (comm.sum_control(next == agreed ? 0.0 : 1.0) == 0 || agreed < 0) {
      step = agreed;
      break;
    }
    step = next;
  }
  if (step < 0) {
    throw InvalidArgument(fmt::format(
        "--resume latest: the hosts of this run hold no checkpoint step in common under "
        "{} (--checkpoint-storage node-local: each host reads its own disk); resume on the "
        "hosts that wrote it",
        cfg.checkpoint_dir));
  }
  return ck::Checkpoint(ck::step_dir(cfg.checkpoint_dir, static_cast<uint64_t>(step)), host_name());
}

std::filesystem::path resume_point(const TrainConfig& cfg) {
  if (cfg.resume.empty()) {
    if (!cfg.checkpoint_dir.empty() && !checkpoint::list_checkpoints(cfg.checkpoint_dir).empty()) {
      throw InvalidArgument(fmt::format(
          "--checkpoint-dir {} already holds checkpoints (newest {}); pass --resume latest to "
          "continue from it, or choose an empty directory",
          cfg.checkpoint_dir, checkpoint::list_checkpoints(cfg.checkpoint_dir).back().string()));
    }
    return {};
  }
  if (cfg.resume != "latest") return checkpoint::resolve(cfg.resume);
  if (cfg.checkpoint_dir.empty()) {
    throw InvalidArgument("--resume latest needs --checkpoint-dir DIR to look in");
  }
  const auto latest = checkpoint::find_latest(cfg.checkpoint_dir);
  if (!latest) {
    throw InvalidArgument(
        fmt::format("--resume latest: {} holds no committed checkpoint (no {}/latest); run without "
                    "--resume to start fresh",
                    cfg.checkpoint_dir, cfg.checkpoint_dir));
  }
  return *latest;
}

}  // namespace zerodp
