// checkpoint_io.h is the contract.
#include "train/checkpoint_io.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <functional>
#include <map>
#include <system_error>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "checkpoint/consolidate.h"
#include "checkpoint/safetensors.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/sysinfo.h"
#include "core/version.h"
#include "optim/moments8.h"
#include "train/flat.h"
#include "train/model_kind.h"
#include "train/moments_io.h"
#include "train/trace.h"

namespace zerodp {

checkpoint::Meta describe_checkpoint(const RankTrainer& trainer, int64_t step) {
  const TrainConfig& cfg = trainer.config();
  // The ranks that write shards: the world, or under HSDP one node's (one copy of states).
  const int world = trainer.group().size();
  checkpoint::Meta m;
  m.zerodp_version = zerodp_version();
  m.step = static_cast<uint64_t>(step);
  m.world_size = world;
  m.islands = cfg.islands;
  m.stage = cfg.stage;
  m.int8_moments = trainer.state().int8_moments();
  if (m.int8_moments) m.moment_code = std::string(moment_code_name(kCurrentMomentCode));
  m.precision = std::string(precision_name(cfg.precision));
  m.model_kind = cfg.model;
  if (const ModelKind& kind = model_kind(cfg.model); kind.shape != nullptr) {
    m.model_shape = kind.shape(cfg);
  }
  for (const UnitState& u : trainer.state().units()) {
    checkpoint::UnitMeta um;
    um.name = u.unit->name();
    um.numel = u.numel;
    for (const TensorSpec& t : u.unit->tensors()) {
      um.tensors.push_back({t.name, t.shape, t.offset, t.numel});
    }
    for (int r = 0; r < world; ++r) um.counts.push_back(u.part.count(r));
    m.units.push_back(std::move(um));
  }
  const nlohmann::json config = config_json(cfg);
  for (const auto& [k, v] : config.items()) {
    m.config[k] = v.is_string() ? v.get<std::string>() : v.dump();
  }
  const OptimizerCounters c = trainer.optimizer().counters();
  m.adam_step = c.adam_step;
  m.lr_next = trainer.optimizer().lr_at(step + 1);
  if (c.scaler) {
    m.loss_scaler =
        checkpoint::ScalerMeta{c.scaler->scale, c.scaler->clean_steps, c.scaler->hysteresis_left};
  }
  const DistributedSampler& sampler = trainer.sampler();
  m.data_epoch = sampler.position().epoch;
  m.data_step = sampler.position().step;
  m.samples_per_step = sampler.samples_per_step();
  m.dataset_size = sampler.options().dataset_size;
  m.seed = cfg.seed;
  m.data_identity = trainer.data().identity;
  m.samples_chain = trainer.samples_chain();
  m.samples_chain_from = trainer.samples_chain_from();
  m.rank_seeds.assign(static_cast<size_t>(m.shard_files()), cfg.seed);
  return m;
}

std::vector<safetensors::TensorDecl> shard_tensors(const ShardedState& state, bool outer,
                                                   bool pending) {
  using checkpoint::tensor_name;
  namespace st = safetensors;
  std::vector<st::TensorDecl> decls;
  for (const UnitState& u : state.units()) {
    const std::vector<int64_t> shape{static_cast<int64_t>(u.own.count())};
    decls.push_back(
        {tensor_name(u.unit->name(), "params"), st::element_type_of(state.dtype()), shape});
    if (!state.fp32())
      decls.push_back({tensor_name(u.unit->name(), "master"), st::ElementType::kF32, shape});
    if (state.int8_moments()) {
      int8_moment_decls(u, decls);
    } else {
      decls.push_back({tensor_name(u.unit->name(), "adam_m"), st::ElementType::kF32, shape});
      decls.push_back({tensor_name(u.unit->name(), "adam_v"), st::ElementType::kF32, shape});
    }
    if (outer) {
      for (const char* kind : {"outer_params", "outer_momentum", "outer_pending"}) {
        if (kind != std::string_view("outer_pending") || pending) {
          decls.push_back({tensor_name(u.unit->name(), kind), st::ElementType::kF32, shape});
        }
      }
    }
  }
  return decls;
}

std::map<std::string, std::string> shard_metadata() {
  return {{"format", std::string(checkpoint::kFormat)}};
}

void stream_shard(const ShardedState& state, StateStore& store, const OuterStep* outer,
                  bool pending, const std::function<void(std::span<const std::byte>)>& sink) {
  const size_t psize = dtype_size(state.dtype());
  for (size_t i = 0; i < state.units().size(); ++i) {
    const UnitState& u = state.units()[i];
    const size_t n = u.own.count();
    // The tensors in the file's order, each streamed from the store (in pieces from the
    // offload file, as one from memory).
    const Range own{u.opt_own, u.opt_own + n};
    std::vector<StateStore::Job> jobs{{i, own, StateStore::kParams}};
    if (!state.fp32()) jobs.push_back({i, own, StateStore::kMaster});
    if (!state.int8_moments()) {
      jobs.push_back({i, own, StateStore::kAdamM});
      jobs.push_back({i, own, StateStore::kAdamV});
    }
    store.stream(jobs, StateStore::Access::kRead, [&](StateStore::Piece& p) {
      if (p.params != nullptr) {
        sink(std::span(static_cast<const std::byte*>(p.params), p.count * psize));
      } else {
        sink(std::as_bytes(std::span<const float>(!p.master.empty() ? p.master
                                                  : !p.m.empty()    ? p.m
                                                                    : p.v)));
      }
    });
    if (state.int8_moments()) stream_int8_moments(u, i, store, sink);
    if (outer != nullptr) {
      sink(std::as_bytes(outer->global(i)));
      sink(std::as_bytes(outer->momentum(i)));
      if (pending) {
        std::vector<float> values(u.own.count());
        outer->pending_values(i, values);
        sink(std::as_bytes(std::span<const float>(values)));
      }
    }
  }
}

std::string write_shard(const ShardedState& state, StateStore& store,
                        const std::filesystem::path& file, const OuterStep* outer, bool pending) {
  safetensors::Writer w(file, shard_tensors(state, outer != nullptr, pending), shard_metadata(),
                        safetensors::WriteMode::kDirect, safetensors::Digest::kCrc32c);
  stream_shard(state, store, outer, pending, [&w](std::span<const std::byte> b) { w.write(b); });
  return w.finish();
}

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

void check_same_model(const RankTrainer& trainer, const checkpoint::Checkpoint& ckpt) {
  const TrainConfig& cfg = trainer.config();
  const std::vector<UnitState>& units = trainer.state().units();
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
    const Unit& mine = *units[i].unit;
    if (saved.name != mine.name() || saved.numel != mine.numel() ||
        saved.tensors.size() != mine.tensors().size()) {
      throw CorruptData(fmt::format(
          "{}: a checkpoint of another model: unit {} is \"{}\" with {} elements there, \"{}\" "
          "with {} in this run",
          where, i, saved.name, saved.numel, mine.name(), mine.numel()));
    }
    for (size_t k = 0; k < saved.tensors.size(); ++k) {
      const TensorSpec& t = mine.tensors()[k];
      const checkpoint::TensorMeta expected{t.name, t.shape, t.offset, t.numel};
      if (!(saved.tensors[k] == expected)) {
        throw CorruptData(fmt::format(
            "{}: a checkpoint of another model: tensor {} of unit {} is {} {} there, {} {} here",
            where, k, mine.name(), saved.tensors[k].name, fmt::join(saved.tensors[k].shape, "x"),
            t.name, fmt::join(t.shape, "x")));
      }
    }
  }
}

namespace {

// Island `island`'s states from the checkpoint into the trainer's (its active island's).
void load_island_states(RankTrainer& trainer, const checkpoint::Checkpoint& ckpt, int island) {
  ShardedState& state = trainer.state();
  const checkpoint::Meta& m = ckpt.meta();
  const bool fp32 = state.fp32();
  const DType dtype = state.dtype();
  const auto saved_dtype = parse_precision(m.precision);
  std::vector<float> tmp;
  for (size_t i = 0; i < state.units().size(); ++i) {
    UnitState& u = state.units()[i];
    // The 16-bit params are the rounded master; read them as saved when the dtype agrees
    // (the same bits the saving run computed with), else round the master here.
    const Range held = u.held;
    const bool same_dtype = saved_dtype && param_dtype(*saved_dtype) == dtype;
    // Elements [at, at + count) of the unit into `into`.
    const auto read_params = [&](size_t at, size_t count, void* into) {
      if (same_dtype) {
        ckpt.read(i, "params", at,
                  std::span(static_cast<std::byte*>(into), count * dtype_size(dtype)), island);
      } else {
        tmp.resize(count);
        ckpt.read_master(i, at, tmp, island);
        narrow(tmp, into, dtype, 0);
      }
    };
    StateStore& store = trainer.store();
    if (held == u.opt_range) {
      // The parameters the optimizer updates are all it holds: they are the store's (the
      // offload file's at stage 3 with optimizer,params).
      const StateStore::Job job{i, {0, held.count()}, StateStore::kParams};
      store.stream(std::span(&job, 1), StateStore::Access::kWrite, [&](StateStore::Piece& p) {
        read_params(held.begin + p.begin, p.count, p.params);
      });
    } else {
      read_params(held.begin, held.count(), u.params.data());
    }
    const size_t n = u.opt_range.count();
    // 8-bit moments on either side: moments_io.h maps and converts them.
    const bool moments8 = m.int8_moments || state.int8_moments();
    std::vector<StateStore::Job> jobs;
    if (!fp32) jobs.push_back({i, {0, n}, StateStore::kMaster});
    if (!moments8) {
      jobs.push_back({i, {0, n}, StateStore::kAdamM});
      jobs.push_back({i, {0, n}, StateStore::kAdamV});
    }
    store.stream(jobs, StateStore::Access::kWrite, [&](StateStore::Piece& p) {
      const size_t at = u.opt_range.begin + p.begin;
      if (!p.master.empty()) {
        ckpt.read_master(i, at, p.master, island);
      } else {
        const bool first_moment = !p.m.empty();
        ckpt.read(i, first_moment ? "adam_m" : "adam_v", at,
                  std::as_writable_bytes(first_moment ? p.m : p.v), island);
      }
    });
    if (moments8) load_moments(state, store, ckpt, i, island);
  }
}

// Every state this rank holds from the checkpoint: its islands', then the outer state.
void load_states(RankTrainer& trainer, const checkpoint::Checkpoint& ckpt) {
  // The island whose states this rank continues (islands in turn: each it holds).
  OuterStep* outer = trainer.outer();
  const int hosted = trainer.hosted_islands();
  for (int v = 0; v < hosted; ++v) {
    trainer.activate_island(v);
    const int island = hosted > 1         ? v
                       : outer != nullptr ? trainer.comm().rank() / trainer.group().size()
                                          : 0;
    load_island_states(trainer, ckpt, island);
  }
  trainer.activate_island(0);
  const ShardedState& state = trainer.state();
  for (size_t i = 0; outer != nullptr && i < state.units().size(); ++i) {
    const UnitState& u = state.units()[i];
    ckpt.read(i, "outer_params", u.own.begin, std::as_writable_bytes(outer->global(i)));
    ckpt.read(i, "outer_momentum", u.own.begin, std::as_writable_bytes(outer->momentum(i)));
    if (ckpt.holds("outer_pending")) {
      std::vector<float> values(u.own.count());
      ckpt.read(i, "outer_pending", u.own.begin, std::as_writable_bytes(std::span(values)));
      outer->restore_pending(static_cast<int64_t>(ckpt.meta().step), i, values);
    }
  }
}

}  // namespace

void load_checkpoint(RankTrainer& trainer, const checkpoint::Checkpoint& ckpt) {
  DistributedSampler& sampler = trainer.sampler();
  const checkpoint::Meta& m = ckpt.meta();
  const TrainConfig& cfg = trainer.config();
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
    load_states(trainer, ckpt);
  } catch (const CorruptData& e) {
    failure = 2;
    error = e.what();
  } catch (const IoError& e) {
    failure = 1;
    error = e.what();
  }
  Communicator& comm = trainer.comm();
  CommPhaseScope phase(comm.ledger(), CommPhase::kOther);
  if (const double worst = comm.max_control(failure); worst > 0) {
    const std::string first = first_error(comm, failure == worst ? error : std::string());
    trainer.activate_island(0);
    if (worst == 2) throw CorruptData(first);
    throw IoError(first);
  }
  OptimizerCounters counters{.adam_step = m.adam_step, .scaler = std::nullopt};
  if (m.loss_scaler) {
    counters.scaler = LossScalerState{.scale = static_cast<float>(m.loss_scaler->scale),
                                      .clean_steps = m.loss_scaler->clean_steps,
                                      .hysteresis_left = m.loss_scaler->hysteresis_left};
  }
  try {
    trainer.optimizer().restore(counters);
  } catch (const InvalidArgument& e) {
    throw CorruptData(
        fmt::format("{}: loss_scaler: {}", (ckpt.dir() / "meta.json").string(), e.what()));
  }
  // The data cursor. With the same samples per step it is exact; otherwise the epoch's
  // samples consumed so far are kept and the step rounds up, so no sample of the epoch is
  // seen twice (the order is the same: it depends on the seed and the epoch only).
  const uint64_t k = sampler.samples_per_step();
  SamplerPosition pos{m.data_epoch, m.data_step};
  if (m.data_identity != trainer.data().identity) {
    const auto named = [](const std::string& id) {  // --tokenizer's start "text ": data/source.cc
      if (id.empty()) return std::string("data held in memory (kjv, synthetic or a text file)");
      return id.starts_with("text ") ? id : "the token shard set of digest " + id.substr(0, 16);
    };
    throw InvalidArgument(fmt::format(
        "{}: trained on {}; this run's --data {} is {}; use the data the checkpoint was "
        "trained on",
        ckpt.dir().string(), named(m.data_identity), trainer.config().data,
        named(trainer.data().identity)));
  }
  if (m.dataset_size != sampler.options().dataset_size) {
    throw InvalidArgument(fmt::format(
        "{}: saved with a training set of {} samples, this run's has {}; use the same --data "
        "and sequence length",
        ckpt.dir().string(), m.dataset_size, sampler.options().dataset_size));
  }
  if (m.samples_per_step != k) {
    const uint64_t consumed = m.data_step * m.samples_per_step;
    pos.step = (consumed + k - 1) / k;
  }
  if (pos.step >= sampler.steps_per_epoch()) pos = {pos.epoch + 1, 0};
  sampler.set_position(pos);
  // A checkpoint from before the chain was kept starts a new one at its step.
  trainer.set_samples_chain(m.samples_chain.empty() ? std::string(64, '0') : m.samples_chain,
                            m.samples_chain.empty() ? m.step : m.samples_chain_from);
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

namespace {

// A CRC-32C as the control channel carries it (a double holds it exactly) and back as hex.
double crc_value(const std::string& hex) {
  return hex.empty() ? 0.0 : static_cast<double>(std::stoul(hex, nullptr, 16));
}
std::string crc_hex(double v) { return fmt::format("{:08x}", static_cast<uint32_t>(v)); }

// Every rank's host name, in rank order (64 bytes each through the control channel).
std::vector<std::string> rank_hosts(Communicator& comm) {
  constexpr size_t kBytes = 64;
  const std::string mine = host_name().substr(0, kBytes);
  std::vector<double> bytes(kBytes, 0.0);
  for (size_t i = 0; i < mine.size(); ++i) bytes[i] = static_cast<unsigned char>(mine[i]);
  const std::vector<double> all = comm.gather_control(bytes);
  std::vector<std::string> hosts(static_cast<size_t>(comm.size()));
  for (size_t r = 0; r < hosts.size(); ++r) {
    for (size_t i = 0; i < kBytes && all[r * kBytes + i] != 0; ++i) {
      hosts[r] += static_cast<char>(all[r * kBytes + i]);
    }
  }
  return hosts;
}

// The ranks that create, commit and prune the checkpoint directory: rank 0 on shared
// storage; on node-local storage the first rank of each host, each in its own directory.
bool directory_owner(const TrainConfig& cfg, const std::vector<std::string>& hosts, int rank) {
  if (!cfg.node_local_checkpoints) return rank == 0;
  for (int q = 0; q < rank; ++q) {
    if (hosts[static_cast<size_t>(q)] == hosts[static_cast<size_t>(rank)]) return false;
  }
  return true;
}

}  // namespace

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

SaveTicket begin_save(RankTrainer& trainer, int64_t step) {
  Communicator& comm = trainer.comm();
  const TrainConfig& cfg = trainer.config();
  namespace ck = checkpoint;
  trainer.settle();
  SaveTicket t;
  t.step = step;
  t.temp = ck::temp_dir(cfg.checkpoint_dir, static_cast<uint64_t>(step));
  const int rank = comm.rank();
  if (cfg.node_local_checkpoints) t.hosts = rank_hosts(comm);
  t.owner = directory_owner(cfg, t.hosts, rank);
  std::string error;
  if (t.owner) {
    try {
      std::filesystem::remove_all(t.temp);
      std::filesystem::create_directories(t.temp);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (comm.sum_control(error.empty() ? 0.0 : 1.0) > 0) {
    if (t.owner && !error.empty()) {
      throw CheckpointNotCommitted(fmt::format("checkpoint at step {}: {}", step, error));
    }
    throw CheckpointNotCommitted(fmt::format("checkpoint at step {}: {} could not create {}", step,
                                             cfg.node_local_checkpoints ? "a host" : "rank 0",
                                             t.temp.string()));
  }
  t.file = t.temp / ck::rank_file_name(rank);
  // Under HSDP the other nodes hold copies of node 0's shards: they write nothing.
  t.writer = trainer.group().primary();
  // Every island holds the same outer state; island 0's ranks save it.
  OuterStep* outer = trainer.outer();
  t.outer = outer != nullptr && rank < trainer.group().size() ? outer : nullptr;
  t.pending = outer != nullptr && outer->in_flight(step).has_value();
  t.meta = describe_checkpoint(trainer, step);
  return t;
}

checkpoint::Meta agree_save(RankTrainer& trainer, const SaveTicket& t, const ShardWritten& w) {
  Communicator& comm = trainer.comm();
  const TrainConfig& cfg = trainer.config();
  namespace ck = checkpoint;
  const int64_t step = t.step;
  const std::string& error = w.error;
  // Agreement: every rank's verdict, size and digest, and rank 0's of the history (every
  // host's meta.json lists it).
  // Per rank: the verdict, then each shard's size and digest (one per island it holds),
  // then the history's.
  const size_t hosted = static_cast<size_t>(trainer.hosted_islands());
  std::vector<double> mine{error.empty() ? 1.0 : 0.0};
  for (size_t v = 0; v < hosted; ++v) {
    const ShardWritten::File none;
    const ShardWritten::File& f = v < w.files.size() ? w.files[v] : none;
    mine.push_back(static_cast<double>(f.bytes));
    mine.push_back(crc_value(f.crc32c));
  }
  const size_t history_at = 1 + 2 * hosted;
  mine.push_back(static_cast<double>(w.history.bytes));
  mine.push_back(crc_value(w.history.crc32c));
  const std::vector<double> all = comm.gather_control(mine);
  const auto entry = [&](int r) { return all.data() + static_cast<size_t>(r) * mine.size(); };
  std::vector<int> failed;
  for (int r = 0; r < comm.size(); ++r) {
    if (entry(r)[0] != 1.0) failed.push_back(r);
  }
  ck::Meta meta = t.meta;
  // Shard R is rank R % N's (R / N)-th: islands in turn write island v's as v N + r; an HSDP
  // replica's rank writes none.
  const int n = comm.size();
  for (int file = 0; failed.empty() && file < meta.shard_files(); ++file) {
    const double* v = entry(file % n) + 1 + 2 * static_cast<size_t>(file / n);
    meta.files.push_back({.name = ck::rank_file_name(file),
                          .bytes = static_cast<uint64_t>(v[0]),
                          .crc32c = crc_hex(v[1]),
                          .sha256 = {}});
    if (cfg.node_local_checkpoints) meta.hosts.push_back(t.hosts[static_cast<size_t>(file % n)]);
  }
  meta.files.push_back({.name = std::string(ck::kHistoryFile),
                        .bytes = static_cast<uint64_t>(all[history_at]),
                        .crc32c = crc_hex(all[history_at + 1]),
                        .sha256 = {}});
  if (cfg.node_local_checkpoints) meta.hosts.push_back(t.hosts[0]);
  if (!failed.empty()) {
    // Every rank names the cause (the file and the system's reason), whichever rank met it
    // and whichever rank's message the run reports.
    const std::string cause = first_error(comm, error);
    // Every rank has finished with the temporary: what it holds can never be committed, and
    // on a full disk its space is what the user needs back.
    if (t.owner) {
      std::error_code ec;
      std::filesystem::remove_all(t.temp, ec);
    }
    throw CheckpointNotCommitted(
        fmt::format("checkpoint at step {} not committed: rank(s) {} could not write "
                    "their files{}{}",
                    step, fmt::join(failed, ", "), cause.empty() ? "" : ": ", cause));
  }
  return meta;
}

std::string first_error(Communicator& comm, const std::string& error) {
  // One message is plenty: the rest of a long one is cut.
  constexpr size_t kMostChars = 1024;
  const size_t mine_chars = std::min(error.size(), kMostChars);
  const auto width = static_cast<size_t>(comm.max_control(static_cast<double>(mine_chars))) + 1;
  std::vector<double> mine(width, 0.0);
  mine[0] = static_cast<double>(mine_chars);
  for (size_t i = 0; i < mine_chars; ++i) mine[1 + i] = static_cast<unsigned char>(error[i]);
  const std::vector<double> all = comm.gather_control(mine);
  for (size_t at = 0; at + width <= all.size(); at += width) {
    const auto n = static_cast<size_t>(all[at]);
    if (n == 0) continue;
    std::string text(n, ' ');
    for (size_t i = 0; i < n; ++i) text[i] = static_cast<char>(static_cast<int>(all[at + 1 + i]));
    return text;
  }
  return {};
}

std::string commit_save(const TrainConfig& cfg, const FaultPlan& faults, const SaveTicket& t,
                        const checkpoint::Meta& meta) {
  if (!t.owner) return {};
  try {
    faults.commit(t.step, cfg.checkpoint_dir);
    // On node-local storage a host prunes only once every host has committed.
    checkpoint::commit(cfg.checkpoint_dir, t.temp, meta, cfg.node_local_checkpoints ? 0 : cfg.keep);
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

void settle_commit(const TrainConfig& cfg, int64_t step, bool owner, bool any_failed,
                   const std::string& error) {
  if (any_failed) {
    throw CheckpointNotCommitted(fmt::format("checkpoint at step {} not committed: {}", step,
                                             !error.empty() ? error
                                             : cfg.node_local_checkpoints
                                                 ? "a host failed to commit it"
                                                 : "rank 0 failed to commit it"));
  }
  if (owner && cfg.node_local_checkpoints) {
    checkpoint::prune(cfg.checkpoint_dir, cfg.keep, static_cast<uint64_t>(step));
  }
}

void finish_save(RankTrainer& trainer, const SaveTicket& t, const ShardWritten& w) {
  const checkpoint::Meta meta = agree_save(trainer, t, w);
  const std::string error = commit_save(trainer.config(), trainer.faults(), t, meta);
  Communicator& comm = trainer.comm();
  const bool failed = comm.sum_control(error.empty() ? 0.0 : 1.0) > 0;
  settle_commit(trainer.config(), t.step, t.owner, failed, failed ? first_error(comm, error) : "");
}

void save_checkpoint(RankTrainer& trainer, int64_t step,
                     const std::vector<checkpoint::StepHistory>& history) {
  CommPhaseScope phase(trainer.comm().ledger(), CommPhase::kOther);
  const Tracer::Span span(trainer.tracer(), "checkpoint", "checkpoint");
  const SaveTicket t = begin_save(trainer, step);
  ShardWritten w;
  try {
    for (int v = 0; t.writer && v < trainer.hosted_islands(); ++v) {
      // Islands in turn: island v's shards are those of rank v N + r of the islands' world,
      // so the checkpoint is the one islands on ranks of their own would write.
      trainer.activate_island(v);
      const std::filesystem::path file =
          v == 0 ? t.file
                 : t.temp / checkpoint::rank_file_name(v * trainer.comm().size() +
                                                       trainer.comm().rank());
      trainer.faults().shard_write(step, file);
      const std::string crc = write_shard(trainer.state(), trainer.store(), file,
                                          v == 0 ? t.outer : nullptr, v == 0 && t.pending);
      w.files.push_back({crc, std::filesystem::file_size(file)});
    }
    trainer.activate_island(0);
    if (trainer.comm().rank() == 0) w.history = checkpoint::write_history(t.temp, history);
  } catch (const std::exception& e) {
    trainer.activate_island(0);
    w.error = e.what();
  }
  checkpoint::failpoint("shard-written", trainer.comm().rank());
  finish_save(trainer, t, w);
}

}  // namespace zerodp
