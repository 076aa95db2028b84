// checkpoint_shards.h is the contract.
#include "train/checkpoint_shards.h"

#include <algorithm>
#include <utility>

#include <nlohmann/json.hpp>

#include "checkpoint/consolidate.h"
#include "core/version.h"
#include "optim/moments8.h"
#include "train/flat.h"
#include "train/model_kind.h"
#include "train/moments_io.h"
#include "train/rank_trainer.h"

namespace zerodp {
namespace {

namespace st = safetensors;

// One island's tensors, in the file's order: per unit its params, master (16-bit runs), the
// moments (8-bit: moments_io.h's), and on island 0's ranks the outer state.
std::vector<ShardTensor> island_tensors(const ShardedState& state, const OuterStep* outer,
                                        bool pending) {
  using checkpoint::tensor_name;
  std::vector<ShardTensor> out;
  for (size_t i = 0; i < state.units().size(); ++i) {
    const UnitState& u = state.units()[i];
    const size_t n = u.own.count();
    const std::vector<int64_t> shape{static_cast<int64_t>(n)};
    const auto stored = [&](const char* kind, st::ElementType type, unsigned array) {
      out.push_back({.decl = {tensor_name(u.unit->name(), kind), type, shape},
                     .unit = i,
                     .array = array,
                     .range = {u.opt_own, u.opt_own + n},
                     .bytes = {},
                     .copy_at_boundary = false});
    };
    stored("params", st::element_type_of(state.dtype()), StateStore::kParams);
    if (!state.fp32()) stored("master", st::ElementType::kF32, StateStore::kMaster);
    if (state.int8_moments()) {
      int8_moment_tensors(state, i, out);
    } else {
      stored("adam_m", st::ElementType::kF32, StateStore::kAdamM);
      stored("adam_v", st::ElementType::kF32, StateStore::kAdamV);
    }
    if (outer == nullptr) continue;
    const auto memory = [&](const char* kind, std::function<void(const ByteSink&)> bytes,
                            bool copy_at_boundary) {
      out.push_back({.decl = {tensor_name(u.unit->name(), kind), st::ElementType::kF32, shape},
                     .unit = i,
                     .array = 0,
                     .range = {},
                     .bytes = std::move(bytes),
                     .copy_at_boundary = copy_at_boundary});
    };
    memory(
        "outer_params", [outer, i](const ByteSink& sink) { sink(std::as_bytes(outer->global(i))); },
        false);
    memory(
        "outer_momentum",
        [outer, i](const ByteSink& sink) { sink(std::as_bytes(outer->momentum(i))); }, false);
    if (!pending) continue;
    // The next round's send rewrites the exchange without waiting for a writer.
    memory(
        "outer_pending",
        [outer, i, n](const ByteSink& sink) {
          std::vector<float> values(n);
          outer->pending_values(i, values);
          sink(std::as_bytes(std::span<const float>(values)));
        },
        true);
  }
  return out;
}

// The bytes of a store's piece of one array.
std::span<const std::byte> piece_bytes(const StateStore::Piece& p, const ShardTensor& t) {
  switch (t.array) {
    case StateStore::kParams:
      return {static_cast<const std::byte*>(p.params), p.count * st::element_size(t.decl.type)};
    case StateStore::kMaster:
      return std::as_bytes(p.master);
    case StateStore::kAdamM:
      return !p.m8.empty() ? std::as_bytes(p.m8) : std::as_bytes(p.m);
    default:
      return !p.v8.empty() ? std::as_bytes(p.v8) : std::as_bytes(p.v);
  }
}

// Island `island`'s states from the checkpoint into `state`, through `store` (the active
// island's).
void load_island_states(ShardedState& state, StateStore& store, const checkpoint::Checkpoint& ckpt,
                        int island) {
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

}  // namespace

uint64_t ShardTensor::byte_count() const {
  uint64_t n = st::element_size(decl.type);
  for (int64_t d : decl.shape) n *= static_cast<uint64_t>(d);
  return n;
}

RankShards rank_shards(RankTrainer& trainer, bool pending) {
  RankShards s;
  s.islands = &trainer.islands();
  s.writer = trainer.group().primary();  // under HSDP the other nodes hold copies
  s.outer = trainer.outer();
  const int n = trainer.comm().size();
  const int rank = trainer.comm().rank();
  const int hosted = trainer.hosted_islands();
  // Every island holds the same outer state; island 0's ranks save it.
  const OuterStep* outer = rank < trainer.group().size() ? s.outer : nullptr;
  for (int v = 0; v < hosted; ++v) {
    RankShards::Island& island = s.held.emplace_back();
    // Islands in turn: island v's shards are those of rank v N + r of the islands' world, so
    // the checkpoint is the one islands on ranks of their own would write.
    island.file = v * n + rank;
    island.saved = hosted > 1 ? v : s.outer != nullptr ? rank / trainer.group().size() : 0;
    // Every island's states are laid out alike; the sources read the active island's.
    if (s.writer) {
      island.tensors = island_tensors(trainer.state(), v == 0 ? outer : nullptr, pending);
    }
  }
  return s;
}

StatesMeta states_meta(const ShardedState& state, int world) {
  StatesMeta s{.world = world, .int8_moments = state.int8_moments(), .units = {}};
  for (const UnitState& u : state.units()) {
    checkpoint::UnitMeta um;
    um.name = u.unit->name();
    um.numel = u.numel;
    for (const TensorSpec& t : u.unit->tensors()) {
      um.tensors.push_back({t.name, t.shape, t.offset, t.numel});
    }
    for (int r = 0; r < world; ++r) um.counts.push_back(u.part.count(r));
    s.units.push_back(std::move(um));
  }
  return s;
}

RunData run_data(const RankTrainer& trainer) {
  const DistributedSampler& sampler = trainer.sampler();
  return {.identity = trainer.data().identity,
          .samples_per_step = sampler.samples_per_step(),
          .dataset_size = sampler.options().dataset_size,
          .steps_per_epoch = sampler.steps_per_epoch()};
}

RunCounters run_counters(const RankTrainer& trainer, int64_t step) {
  return {.optimizer = trainer.optimizer().counters(),
          .data = trainer.sampler().position(),
          .samples_chain = trainer.samples_chain(),
          .samples_chain_from = trainer.samples_chain_from(),
          .lr_next = trainer.optimizer().lr_at(step + 1)};
}

checkpoint::Meta describe_checkpoint(const TrainConfig& cfg, const StatesMeta& states,
                                     const RunData& data, const RunCounters& counters,
                                     int64_t step) {
  checkpoint::Meta m;
  m.zerodp_version = zerodp_version();
  m.step = static_cast<uint64_t>(step);
  m.world_size = states.world;
  m.islands = cfg.islands;
  m.stage = cfg.stage;
  m.int8_moments = states.int8_moments;
  if (m.int8_moments) m.moment_code = std::string(moment_code_name(kCurrentMomentCode));
  m.precision = std::string(precision_name(cfg.precision));
  m.model_kind = cfg.model;
  if (const ModelKind& kind = model_kind(cfg.model); kind.shape != nullptr) {
    m.model_shape = kind.shape(cfg);
  }
  m.units = states.units;
  const nlohmann::json config = config_json(cfg);
  for (const auto& [k, v] : config.items()) {
    m.config[k] = v.is_string() ? v.get<std::string>() : v.dump();
  }
  const OptimizerCounters& c = counters.optimizer;
  m.adam_step = c.adam_step;
  m.lr_next = counters.lr_next;
  if (c.scaler) {
    m.loss_scaler =
        checkpoint::ScalerMeta{c.scaler->scale, c.scaler->clean_steps, c.scaler->hysteresis_left};
  }
  m.data_epoch = counters.data.epoch;
  m.data_step = counters.data.step;
  m.samples_per_step = data.samples_per_step;
  m.dataset_size = data.dataset_size;
  m.seed = cfg.seed;
  m.data_identity = data.identity;
  m.samples_chain = counters.samples_chain;
  m.samples_chain_from = counters.samples_chain_from;
  m.rank_seeds.assign(static_cast<size_t>(m.shard_files()), cfg.seed);
  return m;
}

SaveContent save_content(RankTrainer& trainer, int64_t step) {
  trainer.settle();
  OuterStep* outer = trainer.outer();
  const bool pending = outer != nullptr && outer->in_flight(step).has_value();
  // The ranks that write shards: the world, or under HSDP one node's (one copy of states).
  const StatesMeta states = states_meta(trainer.state(), trainer.group().size());
  return {.meta = describe_checkpoint(trainer.config(), states, run_data(trainer),
                                      run_counters(trainer, step), step),
          .shards = rank_shards(trainer, pending)};
}

std::vector<safetensors::TensorDecl> shard_decls(std::span<const ShardTensor> tensors) {
  std::vector<st::TensorDecl> decls;
  for (const ShardTensor& t : tensors) decls.push_back(t.decl);
  return decls;
}

std::map<std::string, std::string> shard_metadata() {
  return {{"format", std::string(checkpoint::kFormat)}};
}

void stream_shard(std::span<const ShardTensor> tensors, StateStore& store, const ByteSink& sink) {
  // A unit's consecutive store arrays go in one stream (in pieces from the offload file, as
  // one from memory), so the file's reads run ahead across them.
  std::vector<StateStore::Job> jobs;
  std::vector<const ShardTensor*> of_job;
  const auto flush = [&] {
    if (jobs.empty()) return;
    store.stream(jobs, StateStore::Access::kRead,
                 [&](StateStore::Piece& p) { sink(piece_bytes(p, *of_job[p.job])); });
    jobs.clear();
    of_job.clear();
  };
  for (const ShardTensor& t : tensors) {
    if (t.array == 0) {
      flush();
      t.bytes(sink);
      continue;
    }
    if (!jobs.empty() && jobs.back().unit != t.unit) flush();
    jobs.push_back({t.unit, t.range, t.array});
    of_job.push_back(&t);
  }
  flush();
}

std::string write_shard(std::span<const ShardTensor> tensors, StateStore& store,
                        const std::filesystem::path& file) {
  safetensors::Writer w(file, shard_decls(tensors), shard_metadata(),
                        safetensors::WriteMode::kDirect, safetensors::Digest::kCrc32c);
  stream_shard(tensors, store, [&w](std::span<const std::byte> b) { w.write(b); });
  return w.finish();
}

void load_shards(const RankShards& shards, const checkpoint::Checkpoint& ckpt) {
  HeldIslands& islands = *shards.islands;
  islands.for_each([&](int v) {
    load_island_states(islands.state(), islands.store(), ckpt,
                       shards.held[static_cast<size_t>(v)].saved);
  });
  OuterStep* outer = shards.outer;
  const ShardedState& state = islands.state();
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

}  // namespace zerodp
