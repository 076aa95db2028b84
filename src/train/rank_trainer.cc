// rank_trainer.h is the contract.
#include "train/rank_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>
#include <utility>

#include <fmt/core.h>

#include "core/sysinfo.h"
#include "train/flat.h"
#include "train/forecast.h"
#include "train/gather_queue.h"
#include "train/setup.h"
#include "train/stop.h"

namespace zerodp {

int ranks_on_this_host(const Communicator& comm, const LaunchOptions& launch) {
  if (launch.backend == Backend::kMpi) {
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
      if (const char* v = std::getenv(name)) {
        const int n = std::atoi(v) * std::max(1, launch.ranks_per_process);
        if (n >= 1 && n <= comm.size()) return n;
      }
    }
  }
  return comm.size();
}

namespace {

using Clock = std::chrono::steady_clock;

std::string budget_advice_for(const TrainConfig& cfg, const Model& model, int world) {
  if (!cfg.memory_per_rank) return {};
  return budget_advice(cfg, planned_model(model), world, *cfg.memory_per_rank);
}

// Native bf16 products read 16-bit weights from their stored copy (weights_for).
bool products_read_bf16(Precision p) {
  return p == Precision::kBF16 && compute_for(p) == GemmCompute::kBF16 && gemm_bf16_native();
}

}  // namespace

RankTrainer::Buffers::Buffers(MemoryLedger& ledger, const TransientLayout& l, DType param_dtype) {
  constexpr MemCategory kAct = MemCategory::kActivations;
  constexpr MemCategory kWork = MemCategory::kWorkspace;
  for (uint64_t n : l.stream) stream.emplace_back(ledger, kAct, n);
  for (uint64_t n : l.saved) saved.emplace_back(ledger, kAct, n);
  tokens = Buffer<int32_t>(ledger, kAct, l.tokens);
  targets = Buffer<int32_t>(ledger, kAct, l.targets);
  features = Buffer<float>(ledger, kAct, l.features);
  if (l.widened_weights > 0) w32 = Buffer<float>(ledger, kWork, l.widened_weights);
  dw32 = Buffer<float>(ledger, kWork, l.weight_grads);
  dx_a = Buffer<float>(ledger, kWork, l.input_grads);
  dx_b = Buffer<float>(ledger, kWork, l.input_grads);
  scratch = Buffer<float>(ledger, kWork, l.scratch);
  for (int k = 0; k < l.gathered_slots; ++k) {
    gathered.emplace_back(ledger, MemCategory::kGathered, param_dtype, l.gathered);
  }
  for (uint64_t n : l.hpz) hpz.emplace_back(ledger, MemCategory::kHpzParams, param_dtype, n);
  if (l.qwz_staging > 0) {
    for (int k = 0; k < l.gathered_slots; ++k) {
      qwz_staging.emplace_back(ledger, MemCategory::kCommBuffers, DType::kU8, l.qwz_staging);
    }
  }
}

RankTrainer::RankTrainer(const TrainConfig& cfg, Communicator& comm, const DataSplits& data,
                         const ModelFactory& make_model, Communicator* island, Communicator* column)
    : cfg_(cfg),
      comm_(comm),
      group_(island != nullptr ? ShardGroup(*island) : ShardGroup(comm, cfg)),
      compute_(compute_for(cfg.precision)),
      model_(make_model ? make_model() : build_model(cfg)),
      ledger_(comm.rank(), cfg.memory_per_rank, budget_advice_for(cfg, model_, comm.size())),
      data_(data),
      shape_{.B = cfg.micro_batch, .T = is_language_model_data(data.train) ? cfg.seq_len : 1},
      layout_(transient_layout(model_, transient_plan(cfg, data, group_.size()), group_.index())),
      sampler_(SamplerOptions{.dataset_size = dataset_size(data.train),
                              .world_size = comm.size() * zerodp::hosted_islands(cfg),
                              .micro_batch = cfg.micro_batch,
                              .grad_accum = cfg.grad_accum,
                              .seed = cfg.seed,
                              .islands = cfg.islands,
                              .keyed = std::holds_alternative<ShardDataset>(data.train)}),
      state_(model_,
             layout_plan(cfg, StagePlan::make(cfg.stage, cfg.accumulate, fp32_accumulator(cfg))),
             products_read_bf16(cfg.precision), cfg.decay_all, cfg.seed, group_.size(),
             group_.index(), ledger_),
      islands_(state_,
               cfg.offload == Offload::kNone
                   ? nullptr
                   : std::make_unique<OffloadTier>(state_, cfg.offload, cfg.offload_dir,
                                                   comm.rank(), layout_.offload_piece, ledger_)),
      buf_(ledger_, layout_, state_.dtype()),
      hpz_(cfg.hpz && state_.plan().gather_before_compute
               ? std::optional<HpzCopy>(std::in_place, state_.units(), buf_.hpz,
                                        hpz_node_ranks(cfg, group_.size()), group_.index())
               : std::nullopt),
      qwz_(cfg.qwz && state_.plan().gather_before_compute
               ? std::optional<QuantizedGather>(std::in_place, state_.units(), buf_.qwz_staging,
                                                static_cast<size_t>(cfg.qwz_block), group_.index())
               : std::nullopt),
      reducer_(state_, layout_, cfg.grad_accum, group_, ledger_, chunk_),
      optimizer_(cfg, state_, group_, chunk_, store()),
      faults_(cfg.inject, comm.rank(), cfg.launch.comm.timeout_seconds) {
  for (int v = 1; v < zerodp::hosted_islands(cfg); ++v) {
    // Every island starts from the same weights, as on ranks of their own.
    ShardedState states(model_, layout_plan(cfg, state_.plan()), products_read_bf16(cfg.precision),
                        cfg.decay_all, cfg.seed, group_.size(), group_.index(), ledger_);
    // Its tier's file, streamed through island 0's staging (islands' streams never overlap).
    islands_.add(
        std::move(states.units()),
        cfg.offload == Offload::kNone
            ? nullptr
            : std::make_unique<OffloadTier>(state_, cfg.offload, cfg.offload_dir, comm.rank(),
                                            layout_.offload_piece, ledger_, v, islands_.offload()));
  }
  // A tier writes its island's starting master and the parameters rounded from it.
  if (cfg.offload != Offload::kNone) {
    islands_.for_each([this](int) { islands_.offload()->initialize(cfg_.seed); });
  }
  // An overlapped update (--offload-overlap) still streams the active island's states.
  islands_.set_before_switch([this] { optimizer_.settle(); });
  if (column != nullptr) outer_.emplace(cfg, state_, store(), group_, *column, ledger_, islands_);
  // Rank threads that each ask for all cores oversubscribe them; the cores are the ones the
  // process may run on (a host pinned to a cpuset has those, not the machine's).
  set_gemm_threads(std::max(1, usable_cores() / ranks_on_this_host(comm, cfg.launch)));
}

std::span<float> RankTrainer::saved_for(size_t ui) {
  if (!cfg_.checkpoint_activations) return buf_.saved[ui].span();
  return buf_.saved[0].span().first(model_[ui]->saved_count(shape_, compute_));
}

// fp32 weights of unit ui for compute. Stage 3: gathered into `slot` first (the caller has
// issued and waited for the gather). Under bf16 products the product-operand tensors are not
// widened: the products read stored_bf16 instead (Unit::forward/backward's Bf16Operands scope).
std::span<const float> RankTrainer::weights_for(size_t ui, int slot) {
  UnitState& u = state_.units()[ui];
  const void* src =
      state_.plan().gather_before_compute ? buf_.gathered[slot].data() : u.params.data();
  if (state_.fp32()) return {static_cast<const float*>(src), u.numel};
  const std::span<float> w = buf_.w32.span().first(u.numel);
  for (const Range& r : u.widen) widen(src, state_.dtype(), r.begin, w.subspan(r.begin, r.count()));
  return w;
}

std::span<const BFloat16> RankTrainer::stored_bf16(size_t ui, int slot) const {
  if (state_.dtype() != DType::kBF16) return {};
  const UnitState& u = state_.units()[ui];
  const void* src =
      state_.plan().gather_before_compute ? buf_.gathered[slot].data() : u.params.data();
  return {static_cast<const BFloat16*>(src), u.numel};
}

// Token shards are read from disk: the next step's windows of this rank start coming in
// now, under the optimizer step and the next forward, instead of at their first touch.
void RankTrainer::prefetch_next_step() {
  const auto* shards = std::get_if<ShardDataset>(&data_.train);
  if (shards == nullptr) return;
  for (int64_t micro = 0; micro < cfg_.grad_accum; ++micro) {
    shards->prefetch(sampler_.rank_samples(sampler_.position(), micro, virtual_rank()));
  }
}

std::string RankTrainer::samples_chain() const {
  std::string hex;
  for (const uint8_t b : samples_chain_) hex += fmt::format("{:02x}", b);
  return hex;
}

void RankTrainer::set_samples_chain(const std::string& hex, uint64_t from) {
  for (size_t i = 0; i < samples_chain_.size(); ++i) {
    samples_chain_[i] = static_cast<uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  }
  samples_chain_from_ = from;
}

void RankTrainer::load_micro_batch(int64_t micro) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto idx = sampler_.rank_samples(sampler_.position(), micro, virtual_rank());
  sha256_update_u64_le(samples_hash_, idx);
  fill_micro_batch(data_.train, idx);
  data_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Samples `idx` of `dataset` into the micro-batch buffers, and mb_ pointing at them.
void RankTrainer::fill_micro_batch(const Dataset& dataset, std::span<const uint64_t> idx) {
  const float scale = mb_.loss_grad_scale;
  mb_ = MicroBatch{};
  mb_.shape = shape_;
  mb_.loss_grad_scale = scale;
  if (const auto* text = std::get_if<TokenDataset>(&dataset)) {
    text->fill(idx, buf_.tokens.span(), buf_.targets.span());
    mb_.tokens = buf_.tokens.span();
  } else if (const auto* shards = std::get_if<ShardDataset>(&dataset)) {
    shards->fill(idx, buf_.tokens.span(), buf_.targets.span());
    mb_.tokens = buf_.tokens.span();
  } else {
    std::get<ImageDataset>(dataset).fill(idx, buf_.features.span(), buf_.targets.span());
    mb_.features = buf_.features.span();
  }
  mb_.targets = buf_.targets.span();
}

void RankTrainer::wait_for_update(size_t i) {
  if (optimizer_.unit_ready(i)) return;
  const Tracer::Span span(tracer_, "update wait", "wait");
  optimizer_.wait_unit(i);
}

// The backward gathers from the node's hpZ copy (the forward made it); else both passes
// gather qwZ's payloads, or read the offload file when it holds the shards, or gather the
// owners' shards.
std::unique_ptr<GatherSource> RankTrainer::gather_source(bool backward) {
  if (backward && hpz_) return gather_from_node_copy(*hpz_, group_.comm());
  if (qwz_) return gather_quantized(*qwz_, group_.comm(), state_.units());
  if (OffloadTier* tier = offload(); tier != nullptr && tier->holds_params()) {
    return gather_from_file(*tier, group_, state_.units());
  }
  return gather_from_owners(group_, state_.units());
}

double RankTrainer::forward() {
  const size_t U = model_.size();
  std::optional<GatherQueue> gathers;
  if (state_.plan().gather_before_compute) {
    std::vector<size_t> order(U);
    for (size_t i = 0; i < U; ++i) order[i] = i;
    gathers.emplace(buf_.gathered, order, gather_source(false),
                    [this](size_t u) { wait_for_update(u); });
  }
  for (size_t i = 0; i < U; ++i) {
    if (!gathers) wait_for_update(i);
    const int slot = gathers ? gathers->acquire(i) : 0;
    if (hpz_) hpz_->keep(i, buf_.gathered[slot]);
    const Tracer::Span span(tracer_, tracer_ ? "forward " + model_[i]->name() : "");
    const UnitWeights w{
        .values = weights_for(i, slot), .stored_bf16 = stored_bf16(i, slot), .compute = compute_};
    model_[i]->forward(w, buf_.stream[i].span(), buf_.stream[i + 1].span(), saved_for(i),
                       buf_.scratch.span(), mb_);
    if (gathers) gathers->release(i);
  }
  return buf_.stream[U][0];
}

void RankTrainer::backward() {
  const size_t U = model_.size();
  std::optional<GatherQueue> gathers;
  if (state_.plan().gather_before_compute) {
    std::vector<size_t> order(U);
    for (size_t i = 0; i < U; ++i) order[i] = U - 1 - i;
    gathers.emplace(buf_.gathered, order, gather_source(true));
  }
  std::span<float> dout;  // the head starts from mb.loss_grad_scale
  Buffer<float>* din_buf = &buf_.dx_a;
  for (size_t k = 0; k < U; ++k) {
    const size_t i = U - 1 - k;
    Unit& unit = *model_[i];
    const int slot = gathers ? gathers->acquire(k) : 0;
    std::optional<Tracer::Span> span;
    if (tracer_) span.emplace(tracer_, "backward " + unit.name());
    const UnitWeights w{
        .values = weights_for(i, slot), .stored_bf16 = stored_bf16(i, slot), .compute = compute_};
    std::span<float> dw = buf_.dw32.span().first(unit.numel());
    std::fill(dw.begin(), dw.end(), 0.0f);
    std::span<float> din = din_buf->span().first(unit.input_count(shape_));
    std::fill(din.begin(), din.end(), 0.0f);
    // Checkpointing: recompute the unit's forward (same weights, same bits) to refill what
    // its backward needs. The head ran last, so its saved state is still in place; the
    // unit's output buffer is the input of a unit whose backward is already done.
    if (cfg_.checkpoint_activations && i + 1 < U) {
      unit.forward(w, buf_.stream[i].span(), buf_.stream[i + 1].span(), saved_for(i),
                   buf_.scratch.span(), mb_);
    }
    unit.backward(w, buf_.stream[i].span(), saved_for(i), dout, dw, din, buf_.scratch.span(), mb_);
    span.reset();
    if (gathers) gathers->release(k);
    reducer_.add(i, dw);
    dout = din;
    din_buf = din_buf == &buf_.dx_a ? &buf_.dx_b : &buf_.dx_a;
  }
  reducer_.finish_micro_batch();
}

void RankTrainer::island_pass(int64_t step_index) {
  const int A = cfg_.grad_accum;
  losses_.resize(static_cast<size_t>(A));
  for (int a = 0; a < A; ++a) {
    load_micro_batch(a);
    losses_[static_cast<size_t>(a)] = forward();
    // The first forward ran beside the last step's overlapped update, which reads the
    // gradients: they are cleared for this step once it is done.
    if (a == 0) {
      {
        const Tracer::Span span(tracer_, "update wait", "wait");
        optimizer_.settle();
      }
      reducer_.begin_step();
    }
    backward();
  }
  {
    const Tracer::Span span(tracer_, "boundary reduce", "wait");
    reducer_.finish_step();
  }
  faults_.gradients_reduced(step_index, state_);

  // This island's part of the control exchange: the rank's sum of squares, the first unit
  // (index + 1) whose owned gradient is not finite (so a stop can name it), its stop request
  // and its micro-batches' losses. The request rides here because ranks see a signal at
  // different moments, and this makes all of them stop after the same step.
  const OwnGradients own = optimizer_.inspect();
  // Under --shard-within-node every node holds the same ranges: one node's squares count.
  const std::vector<double> squares =
      group_.primary() ? own.sum_squares.to_doubles() : SquareSum{}.to_doubles();
  control_.insert(control_.end(), squares.begin(), squares.end());
  control_.push_back(static_cast<double>(own.first_bad_unit));
  control_.push_back(static_cast<double>(stop_requested()));
  control_.insert(control_.end(), losses_.begin(), losses_.end());
}

StepRecord RankTrainer::step(int64_t step_index) {
  faults_.step_start(step_index);
  const auto t0 = Clock::now();
  CommPhaseScope phase(comm_.ledger(), CommPhase::kTrain);
  StepRecord rec;
  rec.step = step_index;
  const int A = cfg_.grad_accum;
  const int N = comm_.size();
  const int hosted = hosted_islands();
  const double scale = optimizer_.loss_scale();
  // The canonical order seeds every micro-batch alike and divides by the step's
  // micro-batches once, at the boundary (grad_reducer.h).
  mb_.loss_grad_scale = static_cast<float>(state_.plan().fp32_accumulator ? scale : scale / A);
  control_.clear();
  islands_.for_each([&](int) { island_pass(step_index); });

  // The control exchange: each rank's part for each island it holds.
  constexpr size_t kSquares = SquareSum::kExchangeDoubles;
  constexpr size_t kHead = kSquares + 2;
  const size_t fields = kHead + static_cast<size_t>(A);
  std::vector<double> all;
  {
    const Tracer::Span span(tracer_, "verdict", "wait");
    all = comm_.gather_control(control_);
  }
  // The islands' world: rank R = v N + r is rank r's part for island v it holds (islands in
  // turn), or simply rank r.
  const int world = N * hosted;
  const auto part_of = [&](int R) {
    return &all[(static_cast<size_t>(R % N) * hosted + static_cast<size_t>(R / N)) * fields];
  };
  // The norm is of the gradient of the states a rank shares: its island's (the world
  // without --islands), for each island it holds.
  const int n = outer_ ? group_.size() : N;
  std::vector<double> island_squares;
  for (int v = 0; v < hosted; ++v) {
    const int first = hosted > 1 ? v * N : comm_.rank() / n * n;
    SquareSum squares;
    for (int R = first; R < first + n; ++R) {
      squares.merge(SquareSum::from_doubles(std::span(part_of(R), kSquares)));
    }
    island_squares.push_back(squares.value());
  }
  bool bad = false;
  for (int R = 0; R < world; ++R) {
    const double* mine = part_of(R);
    const double first_bad = mine[kSquares];
    if (rec.bad_rank < 0 && first_bad > 0) {
      bad = true;
      rec.bad_rank = R % N;  // the rank it happened on (in turn, in one of its islands)
      rec.bad_unit = model_[static_cast<size_t>(first_bad) - 1]->name();
    }
    const int signal = static_cast<int>(mine[kSquares + 1]);
    if (signal > 0 && (rec.stop_signal == 0 || signal < rec.stop_signal)) rec.stop_signal = signal;
  }
  // The step's loss: the M micro-batch losses in global order i = k * N + r, whatever N is.
  double loss_sum = 0;
  for (int k = 0; k < A; ++k) {
    for (int R = 0; R < world; ++R) loss_sum += part_of(R)[kHead + k];
  }
  rec.loss = loss_sum / (static_cast<double>(A) * world);
  // A non-finite value anywhere skips the step, with --islands in every island, so the
  // islands' AdamW counters and loss scales stay one (a checkpoint holds one of each).
  const bool overflow = bad || !std::isfinite(rec.loss);
  std::optional<Tracer::Span> span;
  if (!overflow) span.emplace(tracer_, "optimizer");
  const UpdateOutcome out = optimizer_.apply(step_index, island_squares, overflow, islands_);
  // An overlapped update is timed in the step after it, which waits for it; the run's last
  // has no such step, so it is waited for here.
  const int64_t last = cfg_.stop_after > 0 ? std::min(cfg_.steps, cfg_.stop_after) : cfg_.steps;
  if (step_index >= last) optimizer_.settle();
  span.reset();
  rec.lr = out.lr;
  rec.grad_norm = out.grad_norm;
  rec.grad_norm_clipped = out.grad_norm_clipped;
  rec.loss_scale = out.loss_scale;
  rec.skipped = out.skipped;
  if (outer_ && outer_->due(step_index)) {
    optimizer_.settle();
    const Tracer::Span outer_span(tracer_, "outer step", "outer");
    rec.outer = outer_->after_step(step_index);
  }
  Sha256 chain;
  chain.update(samples_chain_.data(), samples_chain_.size());
  sha256_update_u64_le(chain, sampler_.step_samples(sampler_.position()));
  samples_chain_ = chain.digest();
  sampler_.advance();
  prefetch_next_step();
  rec.tokens = static_cast<uint64_t>(shape_.B) * static_cast<uint64_t>(shape_.T) *
               static_cast<uint64_t>(A) * static_cast<uint64_t>(world);
  rec.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  rec.data_seconds = std::exchange(data_seconds_, 0.0);
  return rec;
}

// Validation batch k (samples [k b, (k + 1) b)) is rank k mod N's; the losses are folded in
// k's order, so the result does not depend on N.
double RankTrainer::evaluate() {
  settle();
  const uint64_t size = dataset_size(data_.validation);
  const uint64_t b = static_cast<uint64_t>(shape_.B);
  const uint64_t n = static_cast<uint64_t>(comm_.size());
  const uint64_t rank = static_cast<uint64_t>(comm_.rank());
  const uint64_t batches = std::min<uint64_t>(static_cast<uint64_t>(cfg_.eval_batches), size / b);
  const uint64_t per_rank = (batches + n - 1) / n;
  std::vector<double> mine(per_rank, 0.0);
  std::vector<uint64_t> idx(b);
  // Stage 3's forward gathers collectively, so a rank whose share is one batch short
  // runs its last batch again (and discards it) to keep in step.
  const bool in_step = state_.plan().gather_before_compute;
  for (uint64_t j = 0; j < per_rank; ++j) {
    const uint64_t k = j * n + rank;
    if (k >= batches && !in_step) break;
    for (uint64_t e = 0; e < b; ++e) idx[e] = std::min(k, batches - 1) * b + e;
    fill_micro_batch(data_.validation, idx);
    const double loss = forward();
    if (k < batches) mine[j] = loss;
  }
  if (batches == 0) return std::nan("");
  const std::vector<double> all = comm_.gather_control(mine);
  double sum = 0;
  for (uint64_t k = 0; k < batches; ++k) sum += all[(k % n) * per_rank + k / n];
  return sum / static_cast<double>(batches);
}

std::string RankTrainer::weights_sha256(std::vector<float>* keep) {
  settle();
  Sha256 hash;
  const bool sharded = state_.plan().optimizer == StagePlan::Extent::kOwn;
  for (size_t i = 0; i < state_.units().size(); ++i) {
    const UnitState& u = state_.units()[i];
    // The gradient workspace is free after training and holds the largest unit.
    std::span<float> full = buf_.dw32.span().first(u.numel);
    // Sharded, the optimizer range is the own range; else it is all of the unit.
    const size_t at = sharded ? u.own.begin : 0;
    const StateStore::Job job{i, {0, u.opt_range.count()}, StateStore::kMaster};
    store().stream(std::span(&job, 1), StateStore::Access::kRead, [&](StateStore::Piece& p) {
      std::copy(p.master.begin(), p.master.end(),
                full.begin() + static_cast<std::ptrdiff_t>(at + p.begin));
    });
    if (sharded)
      group_.all_gather_async(full.subspan(u.own.begin, u.own.count()), full, u.part).wait();
    // Little-endian on every platform zerodp builds for (x86-64, aarch64).
    hash.update(full.data(), full.size_bytes());
    if (keep != nullptr) keep->insert(keep->end(), full.begin(), full.end());
  }
  return hash.hex_digest();
}

}  // namespace zerodp
