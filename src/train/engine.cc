#include "train/engine.h"

#include <sys/resource.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "checkpoint/format.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/store.h"
#include "comm/communicator.h"
#include "comm/local.h"
#include "core/error.h"
#include "core/files.h"
#include "core/partition.h"
#include "core/sha256.h"
#include "core/sysinfo.h"
#include "core/units.h"
#include "core/version.h"
#include "data/sampler.h"
#include "data/source.h"
#include "models/gpt.h"
#include "models/init.h"
#include "models/mlp.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "tensor/gemm.h"
#include "train/flat.h"
#include "train/outputs.h"
#include "train/plan.h"
#include "train/report.h"
#include "train/setup.h"
#include "train/stop.h"
#include "train/trace.h"

namespace zerodp {

// bf16 runs multiply in bf16 (operands rounded, fp32 sums), as PyTorch's autocast does;
// fp16 runs keep fp32 products: fp16 operands would overflow where bf16's range does not.
// The run's one decision of what products multiply in; it reaches every gemm() through the
// UnitWeights that forward() and backward() hand each unit.
namespace {
GemmCompute compute_for(Precision p) {
  return p == Precision::kBF16 ? GemmCompute::kBF16 : GemmCompute::kFP32;
}
}  // namespace

namespace {

using Clock = std::chrono::steady_clock;

// Ranks sharing this machine's cores: every rank on the local backend; under MPI the
// launcher's count of this host's processes (OpenMPI, MPICH/Hydra), else the whole world.
int ranks_on_this_host(const Communicator& comm, Backend backend) {
  if (backend == Backend::kMpi) {
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
      if (const char* v = std::getenv(name)) {
        const int n = std::atoi(v);
        if (n >= 1 && n <= comm.size()) return n;
      }
    }
  }
  return comm.size();
}

DType param_dtype(Precision p) {
  switch (p) {
    case Precision::kBF16:
      return DType::kBF16;
    case Precision::kFP16:
      return DType::kF16;
    case Precision::kFP32:
      return DType::kF32;
  }
  return DType::kF32;
}

// Byte buffer of `count` elements of `dtype`, charged to one ledger category.
struct Flat {
  Buffer<std::byte> bytes;
  DType dtype = DType::kF32;
  size_t count = 0;
  Flat() = default;
  Flat(MemoryLedger& ledger, MemCategory c, DType t, size_t n)
      : bytes(ledger, c, n * dtype_size(t)), dtype(t), count(n) {}
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  void* at(size_t i) { return bytes.data() + i * dtype_size(dtype); }
  MutableBuffer buffer() { return {bytes.data(), count, dtype}; }
  MutableBuffer range(size_t first, size_t n) { return {at(first), n, dtype}; }
  void zero() {
    if (count) std::memset(bytes.data(), 0, bytes.size());
  }
};

// A segment of the optimizer range with one weight-decay setting.
struct DecaySegment {
  size_t begin = 0;  // relative to the optimizer range
  size_t end = 0;
  bool decay = true;
};

struct UnitState {
  Unit* unit = nullptr;
  size_t numel = 0;
  Partition part;
  Range own;        // this rank's range of the unit's flat buffer
  Range opt_range;  // what this rank's optimizer updates: own, or all of it at stage 0
  Flat params;      // full, or own range when sharding parameters
  Flat grads;       // full, or own range when sharding gradients
  Flat accum_full;  // stage >= 2 with --accumulate local: the full buffer summed until the boundary
  Buffer<float> master;  // 16-bit precisions; fp32 updates `params` in place
  Buffer<float> adam_m;
  Buffer<float> adam_v;
  std::vector<DecaySegment> decay;
  // What weights_for widens: the whole buffer, or under bf16 products only the tensors read
  // other than as product operands (TensorUse), adjacent ones merged.
  std::vector<Range> widen;
};

class RankTrainer {
 public:
  RankTrainer(const TrainConfig& config, Communicator& comm, const DataSplits& data,
              const ModelFactory& make_model)
      : cfg_(config),
        comm_(comm),
        sharding_(Sharding::for_stage(config.stage)),
        dtype_(param_dtype(config.precision)),
        ledger_(comm.rank(), config.memory_per_rank),
        model_(make_model ? make_model() : build_model(config)),
        data_(data) {
    const int n = ranks_on_this_host(comm, config.launch.backend);
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    set_gemm_threads(std::max(1, static_cast<int>(cores) / n));

    shape_ = BatchShape{.B = cfg_.micro_batch,
                        .T = std::holds_alternative<TokenDataset>(data.train) ? cfg_.seq_len : 1};
    SamplerOptions so{.dataset_size = dataset_size(data.train),
                      .world_size = n,
                      .micro_batch = cfg_.micro_batch,
                      .grad_accum = cfg_.grad_accum,
                      .seed = cfg_.seed};
    sampler_ = std::make_unique<DistributedSampler>(so);

    if (cfg_.memory_per_rank) {
      std::vector<uint64_t> numel;
      for (const auto& u : model_) numel.push_back(u->numel());
      ledger_.set_advice(budget_advice(numel, n, cfg_.precision, *cfg_.memory_per_rank));
    }
    CommPhaseScope phase(comm_.ledger(), CommPhase::kOther);
    allocate_states();
    allocate_transients();
    if (cfg_.precision == Precision::kFP16) {
      LossScalerConfig sc;
      sc.initial_scale = cfg_.initial_loss_scale;
      scaler_.emplace(sc);
    }
    LrScheduleConfig lc;
    lc.kind = parse_lr_schedule(cfg_.schedule);
    lc.max_lr = cfg_.lr;
    lc.warmup_steps = cfg_.warmup;
    lc.total_steps = cfg_.steps;
    lc.min_lr = cfg_.lr * cfg_.min_lr_ratio;
    schedule_.emplace(lc);
  }

  uint64_t params() const {
    uint64_t p = 0;
    for (const auto& u : units_) p += u.numel;
    return p;
  }
  const Model& model() const { return model_; }
  MemoryLedger& ledger() { return ledger_; }
  const std::string samples_sha256() const { return samples_hash_.hex_digest(); }

  StepRecord step(int64_t step_index);
  double evaluate();
  void set_tracer(Tracer* t) { tracer_ = t; }
  Tracer* tracer() const { return tracer_; }
  // The injection of `kind` at `step` aimed at this rank, if any.
  const Injection* injected(Injection::Kind kind, int64_t step) const {
    for (const Injection& i : cfg_.inject) {
      if (i.kind == kind && i.step == step && i.rank == comm_.rank()) return &i;
    }
    return nullptr;
  }
  std::string weights_sha256(std::vector<float>* keep);

  // Checkpoints (checkpoint/store.h has the protocol, docs/checkpoint_format.md the format).
  // Everything meta.json says of this run after `step` steps, but the file checksums.
  checkpoint::Meta describe(int64_t step) const;
  // Writes this rank's own ranges into `file`; returns its sha256.
  std::string write_shard(const std::filesystem::path& file) const;
  // CorruptData unless the checkpoint holds this model's units and tensors.
  void check_same_model(const checkpoint::Checkpoint& ckpt) const;
  // Replaces every state with the checkpoint's, read by ranges from whichever shards
  // hold them (any N, any stage, any precision). The caller verified the checkpoint.
  void load(const checkpoint::Checkpoint& ckpt);

 private:
  void allocate_states();
  void allocate_transients();
  void initialize(UnitState& u);
  std::span<const float> weights_for(size_t ui, int slot);
  // The same weights as stored in bf16 (what weights_for widened), or empty.
  std::span<const BFloat16> stored_bf16(size_t ui, int slot) const;
  void load_micro_batch(int64_t micro);
  void fill_micro_batch(const Dataset& dataset, std::span<const uint64_t> idx);
  size_t features_per_sample() const {
    const auto* images = std::get_if<ImageDataset>(&data_.train);
    return images ? static_cast<size_t>(images->pixels_per_image()) : 0;
  }
  std::span<float> saved_for(size_t ui) {
    if (!cfg_.checkpoint_activations) return saved_[ui].span();
    return saved_[0].span().first(units_[ui].unit->saved_count(shape_));
  }
  double forward();
  void backward();
  void reduce_unit_grads(size_t ui, std::span<const float> dw);
  void finish_pending(bool all);
  void add_widened(const void* from, size_t count, void* grads, size_t first);
  void copy_reduced(const void* from, size_t count, void* grads, size_t first);
  void boundary_reduce();
  bool update(double lr, double coef, int64_t adam_step);

  const TrainConfig& cfg_;
  Communicator& comm_;
  Sharding sharding_;
  DType dtype_;
  MemoryLedger ledger_;
  Model model_;
  const DataSplits& data_;
  BatchShape shape_;
  std::unique_ptr<DistributedSampler> sampler_;
  std::vector<UnitState> units_;
  std::optional<LossScaler> scaler_;
  std::optional<LrSchedule> schedule_;
  int64_t adam_step_ = 0;
  Sha256 samples_hash_;

  // Activations: the stream between units (stream_[u] is unit u's input) and what each unit
  // saves for its backward.
  std::vector<Buffer<float>> stream_;
  std::vector<Buffer<float>> saved_;
  Buffer<int32_t> tokens_, targets_;
  Buffer<float> features_;
  // Workspace: weights widened to fp32, their gradient, the gradient flowing backward, scratch.
  Buffer<float> w32_, dw32_, dx_a_, dx_b_, scratch_;
  // Widening space for gradients on their way to the grads buffer and the optimizer: a fixed
  // 64 KiB, allocated with the trainer, so a step allocates nothing for them (outside the
  // ledger: part of the fixed RSS overhead docs/performance.md states).
  std::vector<float> chunk_ = std::vector<float>(16384);
  std::vector<Work> works_;  // the boundary's collectives in flight; capacity kept
  // Stage 3: gathered unit parameters (1 + prefetch buffers).
  std::vector<Flat> gathered_;
  // --accumulate reduce: micro-batch gradient buckets in flight and their reduced shards.
  struct Pending {
    size_t unit = 0;
    Work work;
    int slot = 0;
  };
  std::vector<Flat> buckets_;
  std::vector<Flat> reduced_;
  std::deque<Pending> pending_;
  int next_bucket_ = 0;
  float loss_grad_scale_ = 1.0f;
  MicroBatch mb_;
  Tracer* tracer_ = nullptr;  // --trace: null when off
};

void RankTrainer::allocate_states() {
  const int n = comm_.size();
  const int r = comm_.rank();
  const bool fp32 = cfg_.precision == Precision::kFP32;
  // Native bf16 products read 16-bit weights from their stored copy (weights_for).
  const bool products_read_bf16 = dtype_ == DType::kBF16 &&
                                  compute_for(cfg_.precision) == GemmCompute::kBF16 &&
                                  gemm_bf16_native();
  units_.resize(model_.size());
  for (size_t i = 0; i < model_.size(); ++i) {
    UnitState& u = units_[i];
    u.unit = model_[i].get();
    u.numel = u.unit->numel();
    u.part = Partition(u.numel, n);
    u.own = u.part.range(r);
    u.opt_range = sharding_.optimizer_states ? u.own : Range{0, u.numel};
    u.params =
        Flat(ledger_, MemCategory::kParams, dtype_, sharding_.parameters ? u.own.count() : u.numel);
    u.grads =
        Flat(ledger_, MemCategory::kGrads, dtype_, sharding_.gradients ? u.own.count() : u.numel);
    const size_t opt = u.opt_range.count();
    if (!fp32) u.master = Buffer<float>(ledger_, MemCategory::kMaster, opt);
    u.adam_m = Buffer<float>(ledger_, MemCategory::kAdamM, opt);
    u.adam_v = Buffer<float>(ledger_, MemCategory::kAdamV, opt);
    for (const TensorSpec& t : u.unit->tensors()) {
      if (products_read_bf16 && t.use == TensorUse::kProductOperand) continue;
      if (!u.widen.empty() && u.widen.back().end == t.offset) {
        u.widen.back().end += t.numel;
      } else {
        u.widen.push_back({t.offset, t.offset + t.numel});
      }
    }
    // Decay policy as data: one segment per tensor overlapping the optimizer range.
    for (const TensorSpec& t : u.unit->tensors()) {
      const size_t b = std::max(t.offset, u.opt_range.begin);
      const size_t e = std::min(t.offset + t.numel, u.opt_range.end);
      if (b < e) {
        u.decay.push_back(
            {b - u.opt_range.begin, e - u.opt_range.begin, cfg_.decay_all || t.weight_decay});
      }
    }
    initialize(u);
  }
}

// Every rank initializes exactly the ranges it holds, from the pure init function, so the
// starting model is the same for every N and stage and no rank materializes what it does
// not keep.
void RankTrainer::initialize(UnitState& u) {
  const bool fp32 = cfg_.precision == Precision::kFP32;
  const Range held = sharding_.parameters ? u.own : Range{0, u.numel};
  std::vector<float> tmp;
  constexpr size_t kChunk = 1 << 16;
  for (size_t b = held.begin; b < held.end; b += kChunk) {
    const size_t e = std::min(held.end, b + kChunk);
    tmp.resize(e - b);
    initialize_range(cfg_.seed, *u.unit, b, e, tmp);
    narrow(tmp, u.params.data(), dtype_, b - held.begin);
    if (!fp32 && b < u.opt_range.end && e > u.opt_range.begin) {
      const size_t ob = std::max(b, u.opt_range.begin);
      const size_t oe = std::min(e, u.opt_range.end);
      std::copy(tmp.begin() + static_cast<std::ptrdiff_t>(ob - b),
                tmp.begin() + static_cast<std::ptrdiff_t>(oe - b),
                u.master.data() + (ob - u.opt_range.begin));
    }
  }
  // `held` always covers the optimizer range: the full buffer below stage 3, and at stage 3
  // held == own == opt_range.
}

void RankTrainer::allocate_transients() {
  size_t max_numel = 0, max_own = 0, max_in = 0, max_scratch = 0;
  for (const auto& u : units_) {
    max_numel = std::max(max_numel, u.numel);
    max_own = std::max(max_own, u.own.count());
  }
  stream_.clear();
  saved_.clear();
  size_t max_saved = 0;
  for (size_t i = 0; i < units_.size(); ++i) {
    const Unit& unit = *units_[i].unit;
    stream_.emplace_back(ledger_, MemCategory::kActivations, unit.input_count(shape_));
    // Checkpointing keeps only each unit's input; one buffer serves every recompute.
    if (!cfg_.checkpoint_activations) {
      saved_.emplace_back(ledger_, MemCategory::kActivations, unit.saved_count(shape_));
    }
    max_saved = std::max(max_saved, unit.saved_count(shape_));
    max_in = std::max(max_in, unit.input_count(shape_));
    max_scratch = std::max(max_scratch, unit.scratch_count(shape_));
  }
  if (cfg_.checkpoint_activations) {
    saved_.emplace_back(ledger_, MemCategory::kActivations, max_saved);
  }
  // The head's output: the loss.
  stream_.emplace_back(ledger_, MemCategory::kActivations,
                       units_.back().unit->output_count(shape_));
  const size_t rows = static_cast<size_t>(shape_.B) * static_cast<size_t>(shape_.T);
  const bool text = std::holds_alternative<TokenDataset>(data_.train);
  tokens_ = Buffer<int32_t>(ledger_, MemCategory::kActivations, text ? rows : 0);
  targets_ = Buffer<int32_t>(ledger_, MemCategory::kActivations, rows);
  features_ = Buffer<float>(ledger_, MemCategory::kActivations, features_per_sample() * rows);

  const bool fp32 = dtype_ == DType::kF32;
  // Resident fp32 parameters need no widening copy; 16-bit ones are widened per unit.
  if (!fp32) w32_ = Buffer<float>(ledger_, MemCategory::kWorkspace, max_numel);
  dw32_ = Buffer<float>(ledger_, MemCategory::kWorkspace, max_numel);
  dx_a_ = Buffer<float>(ledger_, MemCategory::kWorkspace, max_in);
  dx_b_ = Buffer<float>(ledger_, MemCategory::kWorkspace, max_in);
  scratch_ = Buffer<float>(ledger_, MemCategory::kWorkspace, max_scratch);

  if (sharding_.parameters) {
    for (int k = 0; k < 1 + cfg_.prefetch; ++k) {
      gathered_.emplace_back(ledger_, MemCategory::kGathered, dtype_, max_numel);
    }
  }
  if (sharding_.gradients && cfg_.accumulate == AccumulatePolicy::kLocal) {
    for (auto& u : units_) u.accum_full = Flat(ledger_, MemCategory::kGradBuckets, dtype_, u.numel);
  }
  if (cfg_.accumulate == AccumulatePolicy::kReduce) {
    // Two buckets: one reduces while the next unit's backward fills the other.
    for (int k = 0; k < 2; ++k) {
      buckets_.emplace_back(ledger_, MemCategory::kGradBuckets, dtype_, max_numel);
      if (sharding_.optimizer_states || sharding_.gradients) {
        reduced_.emplace_back(ledger_, MemCategory::kCommBuffers, dtype_, max_own);
      }
    }
  }
}

// fp32 weights of unit ui for compute. Stage 3: gathered into `slot` first (the caller has
// issued and waited for the gather). Under bf16 products the product-operand tensors are not
// widened: the products read stored_bf16 instead (Unit::forward/backward's Bf16Operands scope).
std::span<const float> RankTrainer::weights_for(size_t ui, int slot) {
  UnitState& u = units_[ui];
  const void* src = u.params.data();
  if (sharding_.parameters) src = gathered_[slot].data();
  if (dtype_ == DType::kF32) return {static_cast<const float*>(src), u.numel};
  const std::span<float> w = w32_.span().first(u.numel);
  for (const Range& r : u.widen) widen(src, dtype_, r.begin, w.subspan(r.begin, r.count()));
  return w;
}

std::span<const BFloat16> RankTrainer::stored_bf16(size_t ui, int slot) const {
  if (dtype_ != DType::kBF16) return {};
  const UnitState& u = units_[ui];
  const void* src = sharding_.parameters ? gathered_[slot].data() : u.params.data();
  return {static_cast<const BFloat16*>(src), u.numel};
}

void RankTrainer::load_micro_batch(int64_t micro) {
  const auto idx = sampler_->rank_samples(sampler_->position(), micro, comm_.rank());
  sha256_update_u64_le(samples_hash_, idx);
  fill_micro_batch(data_.train, idx);
  mb_.loss_grad_scale = loss_grad_scale_;
}

// Samples `idx` of `dataset` into the micro-batch buffers, and mb_ pointing at them.
void RankTrainer::fill_micro_batch(const Dataset& dataset, std::span<const uint64_t> idx) {
  mb_ = MicroBatch{};
  mb_.shape = shape_;
  if (const auto* text = std::get_if<TokenDataset>(&dataset)) {
    text->fill(idx, tokens_.span(), targets_.span());
    mb_.tokens = tokens_.span();
  } else {
    std::get<ImageDataset>(dataset).fill(idx, features_.span(), targets_.span());
    mb_.features = features_.span();
  }
  mb_.targets = targets_.span();
}

// Gathers for stage 3 run ahead of compute by up to `prefetch` units.
class GatherQueue {
 public:
  GatherQueue(Communicator& comm, std::vector<UnitState>& units, std::vector<Flat>& slots,
              std::vector<size_t> order)
      : comm_(comm), units_(units), slots_(slots), order_(std::move(order)) {
    while (issued_ < order_.size() && issued_ < slots_.size()) issue();
  }
  // Waits for the i-th unit of the order; returns its slot.
  int acquire(size_t i) {
    works_[i].wait();
    return static_cast<int>(i % slots_.size());
  }
  // The i-th unit is done with its slot: reuse it for the next gather.
  void release(size_t) {
    if (issued_ < order_.size()) issue();
  }

 private:
  void issue() {
    UnitState& u = units_[order_[issued_]];
    Flat& slot = slots_[issued_ % slots_.size()];
    works_.push_back(comm_.all_gather_async(u.params.buffer(), slot.range(0, u.numel), u.part));
    ++issued_;
  }
  Communicator& comm_;
  std::vector<UnitState>& units_;
  std::vector<Flat>& slots_;
  std::vector<size_t> order_;
  std::vector<Work> works_;
  size_t issued_ = 0;
};

double RankTrainer::forward() {
  const size_t U = units_.size();
  std::optional<GatherQueue> gathers;
  if (sharding_.parameters) {
    std::vector<size_t> order(U);
    for (size_t i = 0; i < U; ++i) order[i] = i;
    gathers.emplace(comm_, units_, gathered_, order);
  }
  for (size_t i = 0; i < U; ++i) {
    const int slot = gathers ? gathers->acquire(i) : 0;
    const Tracer::Span span(tracer_, tracer_ ? "forward " + units_[i].unit->name() : "");
    const UnitWeights w{.values = weights_for(i, slot),
                        .stored_bf16 = stored_bf16(i, slot),
                        .compute = compute_for(cfg_.precision)};
    units_[i].unit->forward(w, stream_[i].span(), stream_[i + 1].span(), saved_for(i),
                            scratch_.span(), mb_);
    if (gathers) gathers->release(i);
  }
  return stream_[U][0];
}

void RankTrainer::backward() {
  const size_t U = units_.size();
  std::optional<GatherQueue> gathers;
  if (sharding_.parameters) {
    std::vector<size_t> order(U);
    for (size_t i = 0; i < U; ++i) order[i] = U - 1 - i;
    gathers.emplace(comm_, units_, gathered_, order);
  }
  std::span<float> dout;  // the head starts from mb.loss_grad_scale
  Buffer<float>* din_buf = &dx_a_;
  for (size_t k = 0; k < U; ++k) {
    const size_t i = U - 1 - k;
    UnitState& u = units_[i];
    const int slot = gathers ? gathers->acquire(k) : 0;
    std::optional<Tracer::Span> span;
    if (tracer_) span.emplace(tracer_, "backward " + u.unit->name());
    const UnitWeights w{.values = weights_for(i, slot),
                        .stored_bf16 = stored_bf16(i, slot),
                        .compute = compute_for(cfg_.precision)};
    std::span<float> dw = dw32_.span().first(u.numel);
    std::fill(dw.begin(), dw.end(), 0.0f);
    std::span<float> din = din_buf->span().first(u.unit->input_count(shape_));
    std::fill(din.begin(), din.end(), 0.0f);
    // Checkpointing: recompute the unit's forward (same weights, same bits) to refill what
    // its backward needs. The head ran last, so its saved state is still in place; the
    // unit's output buffer is the input of a unit whose backward is already done.
    if (cfg_.checkpoint_activations && i + 1 < U) {
      u.unit->forward(w, stream_[i].span(), stream_[i + 1].span(), saved_for(i), scratch_.span(),
                      mb_);
    }
    u.unit->backward(w, stream_[i].span(), saved_for(i), dout, dw, din, scratch_.span(), mb_);
    span.reset();
    if (gathers) gathers->release(k);
    reduce_unit_grads(i, dw);
    dout = din;
    din_buf = din_buf == &dx_a_ ? &dx_b_ : &dx_a_;
  }
  finish_pending(true);
}

// One unit's micro-batch gradient (fp32, already scaled) goes where the policy says.
void RankTrainer::reduce_unit_grads(size_t ui, std::span<const float> dw) {
  UnitState& u = units_[ui];
  if (cfg_.accumulate == AccumulatePolicy::kLocal) {
    Flat& target = sharding_.gradients ? u.accum_full : u.grads;
    accumulate(dw, target.data(), dtype_, 0);
    return;
  }
  // kReduce: round into a bucket, reduce it (asynchronously), and add the result to the
  // owned range when it arrives. At most two buckets are in flight.
  if (pending_.size() == buckets_.size()) finish_pending(false);
  const int slot = next_bucket_;
  next_bucket_ = (next_bucket_ + 1) % static_cast<int>(buckets_.size());
  Flat& bucket = buckets_[slot];
  narrow(dw, bucket.data(), dtype_, 0);
  Pending p{ui, Work(), slot};
  if (!sharding_.optimizer_states && !sharding_.gradients) {
    p.work = comm_.all_reduce_async(bucket.range(0, u.numel), ReduceOp::kAvg);
  } else {
    p.work = comm_.reduce_scatter_async(
        bucket.range(0, u.numel), reduced_[slot].range(0, u.own.count()), u.part, ReduceOp::kAvg);
  }
  pending_.push_back(std::move(p));
}

void RankTrainer::finish_pending(bool all) {
  while (!pending_.empty()) {
    Pending& p = pending_.front();
    p.work.wait();
    UnitState& u = units_[p.unit];
    // With one micro-batch per step the reduced gradient is the step's whole gradient and the
    // target was zeroed: copy it (adding it to zeros, widened and rounded back, gives the same
    // values at the cost of two more passes; only a zero's sign can differ, which no update
    // or norm sees).
    const auto add = cfg_.grad_accum == 1 ? &RankTrainer::copy_reduced : &RankTrainer::add_widened;
    if (!sharding_.optimizer_states && !sharding_.gradients) {
      (this->*add)(buckets_[p.slot].data(), u.numel, u.grads.data(), 0);
    } else {
      (this->*add)(reduced_[p.slot].data(), u.own.count(), u.grads.data(),
                   sharding_.gradients ? 0 : u.own.begin);
    }
    pending_.pop_front();
    if (!all) break;
  }
}

// grads[first + i] = from[i] for i < count, both in the run's dtype.
void RankTrainer::copy_reduced(const void* from, size_t count, void* grads, size_t first) {
  const size_t size = dtype_size(dtype_);
  if (count) std::memcpy(static_cast<std::byte*>(grads) + first * size, from, count * size);
}

// grads[first + i] += from[i] for i < count, both in the run's dtype, through the fixed
// chunk_ buffer: no allocation inside a step, and the same roundings as one whole pass.
void RankTrainer::add_widened(const void* from, size_t count, void* grads, size_t first) {
  if (dtype_ == DType::kF32) {
    accumulate(std::span<const float>(static_cast<const float*>(from), count), grads, dtype_,
               first);
    return;
  }
  for (size_t b = 0; b < count; b += chunk_.size()) {
    const std::span<float> piece =
        std::span<float>(chunk_).first(std::min(chunk_.size(), count - b));
    widen(from, dtype_, b, piece);
    accumulate(piece, grads, dtype_, first + b);
  }
}

// --accumulate local: the one reduction of the step, at the boundary.
void RankTrainer::boundary_reduce() {
  if (cfg_.accumulate != AccumulatePolicy::kLocal) return;
  works_.clear();
  for (auto& u : units_) {
    if (sharding_.gradients) {
      works_.push_back(comm_.reduce_scatter_async(u.accum_full.buffer(), u.grads.buffer(), u.part,
                                                  ReduceOp::kAvg));
    } else if (sharding_.optimizer_states) {
      works_.push_back(comm_.reduce_scatter_async(
          u.grads.buffer(), u.grads.range(u.own.begin, u.own.count()), u.part, ReduceOp::kAvg));
    } else {
      works_.push_back(comm_.all_reduce_async(u.grads.buffer(), ReduceOp::kAvg));
    }
  }
  for (auto& w : works_) w.wait();
  works_.clear();
}

// AdamW on the optimizer range; then the updated parameters are rounded into place and,
// at stages 1-2, all-gathered.
bool RankTrainer::update(double lr, double coef, int64_t adam_step) {
  const bool fp32 = dtype_ == DType::kF32;
  AdamWConfig ac;
  ac.lr = lr;
  ac.weight_decay = cfg_.weight_decay;
  works_.clear();
  for (auto& u : units_) {
    const size_t n = u.opt_range.count();
    if (n > 0) {
      // Gradient of the optimizer range: the grads buffer holds it at offset 0 when sharded.
      const size_t gfirst = sharding_.gradients ? 0 : u.opt_range.begin;
      std::span<float> master =
          fp32 ? std::span<float>(static_cast<float*>(u.params.data()) +
                                      (sharding_.parameters ? 0 : u.opt_range.begin),
                                  n)
               : u.master.span();
      // AdamW is elementwise: chunk by chunk (widening the gradient into chunk_ unless it is
      // fp32 already) gives the same bits as one pass.
      for (const DecaySegment& s : u.decay) {
        for (size_t b = s.begin; b < s.end; b += chunk_.size()) {
          const size_t len = std::min(chunk_.size(), s.end - b);
          std::span<const float> grad;
          if (fp32) {
            grad =
                std::span<const float>(static_cast<const float*>(u.grads.data()) + gfirst + b, len);
          } else {
            const std::span<float> piece = std::span<float>(chunk_).first(len);
            widen(u.grads.data(), dtype_, gfirst + b, piece);
            grad = piece;
          }
          const AdamWShard shard{.master = master.subspan(b, len),
                                 .m = u.adam_m.span().subspan(b, len),
                                 .v = u.adam_v.span().subspan(b, len),
                                 .grad = grad,
                                 .offset = u.opt_range.begin + b};
          adamw_update(shard, s.decay, ac, adam_step, static_cast<float>(coef));
        }
      }
      if (!fp32) {
        narrow(master, u.params.data(), dtype_, sharding_.parameters ? 0 : u.opt_range.begin);
      }
    }
    if (sharding_.optimizer_states && !sharding_.parameters) {
      works_.push_back(comm_.all_gather_async(u.params.range(u.own.begin, u.own.count()),
                                              u.params.buffer(), u.part));
    }
  }
  for (auto& w : works_) w.wait();
  works_.clear();
  return true;
}

StepRecord RankTrainer::step(int64_t step_index) {
  if (injected(Injection::Kind::kKill, step_index)) ::raise(SIGKILL);
  // As SIGTERM arriving at this rank alone: the others learn of it in this step's exchange.
  if (injected(Injection::Kind::kTerm, step_index)) request_stop(SIGTERM);
  if (injected(Injection::Kind::kThrow, step_index)) {
    throw Error(fmt::format("injected failure (--inject throw@{}:{})", step_index, comm_.rank()));
  }
  // An allocation failing at run time: what the preflight cannot rule out.
  if (injected(Injection::Kind::kOom, step_index)) throw std::bad_alloc();
  if (injected(Injection::Kind::kHang, step_index)) {
    // Not arriving: past the collective timeout the peers give up and abort the world, and
    // this rank's next collective fails with their verdict (under MPI the job is ended first).
    std::this_thread::sleep_for(
        std::chrono::duration<double>(cfg_.launch.comm.timeout_seconds + 1.0));
  }
  const auto t0 = Clock::now();
  CommPhaseScope phase(comm_.ledger(), CommPhase::kTrain);
  StepRecord rec;
  rec.step = step_index;
  const int A = cfg_.grad_accum;
  const double scale = scaler_ ? scaler_->scale() : 1.0;
  loss_grad_scale_ = static_cast<float>(scale / A);
  for (auto& u : units_) {
    u.grads.zero();
    u.accum_full.zero();
  }
  double loss_sum = 0;
  for (int a = 0; a < A; ++a) {
    load_micro_batch(a);
    loss_sum += forward();
    backward();
  }
  {
    const Tracer::Span span(tracer_, "boundary reduce", "wait");
    boundary_reduce();
  }

  if (injected(Injection::Kind::kNan, step_index)) {
    // One element of this rank's gradient shard, in the last unit that owns any.
    for (size_t i = units_.size(); i-- > 0;) {
      UnitState& u = units_[i];
      if (u.own.count() == 0) continue;
      const float nan = std::numeric_limits<float>::quiet_NaN();
      narrow(std::span<const float>(&nan, 1), u.grads.data(), dtype_,
             sharding_.gradients ? 0 : u.own.begin);
      break;
    }
  }

  // Verdicts on the owned ranges, the same data at every stage. Each rank reports the first
  // unit (index + 1) whose owned gradient is not finite, so a stop can name it.
  double bad_unit = 0;
  double sq = 0;
  for (size_t i = 0; i < units_.size(); ++i) {
    UnitState& u = units_[i];
    const size_t first = sharding_.gradients ? 0 : u.own.begin;
    if (bad_unit == 0 && !all_finite(u.grads.data(), dtype_, first, u.own.count())) {
      bad_unit = static_cast<double>(i + 1);
    }
    sq += sum_squares(u.grads.data(), dtype_, first, u.own.count());
  }
  // The stop request rides in the same exchange: ranks see a signal at different moments,
  // and this makes all of them stop after the same step.
  constexpr size_t kFields = 4;
  const double partial[kFields] = {sq, bad_unit, loss_sum / A,
                                   static_cast<double>(stop_requested())};
  std::vector<double> all;
  {
    const Tracer::Span span(tracer_, "verdict", "wait");
    all = comm_.gather_control(partial);
  }
  // Summed in rank order, as sum_control() would.
  double totals[3] = {0, 0, 0};
  for (int r = 0; r < comm_.size(); ++r) {
    const double* mine = &all[static_cast<size_t>(r) * kFields];
    for (size_t k = 0; k < 3; ++k) totals[k] += mine[k];
    if (rec.bad_rank < 0 && mine[1] > 0) {
      rec.bad_rank = r;
      rec.bad_unit = units_[static_cast<size_t>(mine[1]) - 1].unit->name();
    }
    const int signal = static_cast<int>(mine[3]);
    if (signal > 0 && (rec.stop_signal == 0 || signal < rec.stop_signal)) rec.stop_signal = signal;
  }
  const bool overflow = totals[1] > 0 || !std::isfinite(totals[2]);
  rec.loss = totals[2] / comm_.size();
  rec.loss_scale = scaler_ ? std::optional<double>(scale) : std::nullopt;
  const double norm = std::sqrt(totals[0]) / scale;
  rec.grad_norm = norm;
  const double coef = cfg_.clip > 0 ? clip_coefficient(norm, cfg_.clip) : 1.0;
  rec.grad_norm_clipped = norm * coef;
  rec.lr = schedule_->lr_at(step_index - 1);
  if (overflow) {
    rec.skipped = true;
    rec.grad_norm_clipped = rec.grad_norm;
  } else {
    ++adam_step_;
    const Tracer::Span span(tracer_, "optimizer");
    update(rec.lr, coef / scale, adam_step_);
  }
  if (scaler_) (void)scaler_->update(overflow);
  sampler_->advance();
  rec.tokens = static_cast<uint64_t>(shape_.B) * static_cast<uint64_t>(shape_.T) *
               static_cast<uint64_t>(A) * static_cast<uint64_t>(comm_.size());
  rec.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return rec;
}

// Mean loss over up to eval_batches validation micro-batches per rank, ranks' slices
// disjoint; forward only.
double RankTrainer::evaluate() {
  const uint64_t size = dataset_size(data_.validation);
  const uint64_t b = static_cast<uint64_t>(shape_.B);
  const uint64_t n = static_cast<uint64_t>(comm_.size());
  const uint64_t batches =
      std::min<uint64_t>(static_cast<uint64_t>(cfg_.eval_batches), size / (b * n));
  double sum = 0;
  std::vector<uint64_t> idx(b);
  for (uint64_t k = 0; k < batches; ++k) {
    for (uint64_t j = 0; j < b; ++j) idx[j] = (k * n + static_cast<uint64_t>(comm_.rank())) * b + j;
    fill_micro_batch(data_.validation, idx);
    sum += forward();
  }
  const double total = comm_.sum_control(sum);
  return batches == 0 ? std::nan("") : total / static_cast<double>(batches * n);
}

// sha256 of the consolidated fp32 master weights, units and tensors in canonical order.
std::string RankTrainer::weights_sha256(std::vector<float>* keep) {
  const bool fp32 = dtype_ == DType::kF32;
  Sha256 hash;
  for (auto& u : units_) {
    // The gradient workspace is free after training and holds the largest unit.
    std::span<float> full = dw32_.span().first(u.numel);
    const float* mine = fp32 ? static_cast<const float*>(u.params.data()) +
                                   (sharding_.parameters ? 0 : u.opt_range.begin)
                             : u.master.data();
    if (sharding_.optimizer_states) {
      comm_.all_gather(std::span<const float>(mine, u.own.count()), full, u.part);
    } else {
      std::copy(mine, mine + u.numel, full.data());
    }
    // Little-endian on every platform zerodp builds for (x86-64, aarch64).
    hash.update(full.data(), full.size_bytes());
    if (keep != nullptr) keep->insert(keep->end(), full.data(), full.data() + full.size());
  }
  return hash.hex_digest();
}

checkpoint::Meta RankTrainer::describe(int64_t step) const {
  checkpoint::Meta m;
  m.zerodp_version = zerodp_version();
  m.step = static_cast<uint64_t>(step);
  m.world_size = comm_.size();
  m.stage = cfg_.stage;
  m.precision = std::string(precision_name(cfg_.precision));
  m.model_kind = cfg_.model;
  if (cfg_.model == "gpt") {
    m.model_shape = {{"layers", cfg_.layers},
                     {"heads", cfg_.heads},
                     {"embd", cfg_.embd},
                     {"seq_len", cfg_.seq_len},
                     {"vocab", 256}};
  } else if (cfg_.model == "mlp") {
    m.model_shape = {{"hidden", cfg_.mlp_hidden}, {"hidden_layers", cfg_.mlp_layers}};
  }
  for (const UnitState& u : units_) {
    checkpoint::UnitMeta um;
    um.name = u.unit->name();
    um.numel = u.numel;
    for (const TensorSpec& t : u.unit->tensors()) {
      um.tensors.push_back({t.name, t.shape, t.offset, t.numel});
    }
    for (int r = 0; r < comm_.size(); ++r) um.counts.push_back(u.part.count(r));
    m.units.push_back(std::move(um));
  }
  const nlohmann::json config = config_json(cfg_);
  for (const auto& [k, v] : config.items()) {
    m.config[k] = v.is_string() ? v.get<std::string>() : v.dump();
  }
  m.adam_step = adam_step_;
  m.lr_next = schedule_->lr_at(step);
  if (scaler_) {
    const LossScalerState& st = scaler_->state();
    m.loss_scaler = checkpoint::ScalerMeta{st.scale, st.clean_steps, st.hysteresis_left};
  }
  m.data_epoch = sampler_->position().epoch;
  m.data_step = sampler_->position().step;
  m.samples_per_step = sampler_->samples_per_step();
  m.dataset_size = sampler_->options().dataset_size;
  m.seed = cfg_.seed;
  m.rank_seeds.assign(static_cast<size_t>(comm_.size()), cfg_.seed);
  return m;
}

std::string RankTrainer::write_shard(const std::filesystem::path& file) const {
  using checkpoint::tensor_name;
  namespace st = safetensors;
  const bool fp32 = dtype_ == DType::kF32;
  std::vector<st::TensorDecl> decls;
  for (const UnitState& u : units_) {
    const std::vector<int64_t> shape{static_cast<int64_t>(u.own.count())};
    decls.push_back({tensor_name(u.unit->name(), "params"), st::element_type_of(dtype_), shape});
    if (!fp32)
      decls.push_back({tensor_name(u.unit->name(), "master"), st::ElementType::kF32, shape});
    decls.push_back({tensor_name(u.unit->name(), "adam_m"), st::ElementType::kF32, shape});
    decls.push_back({tensor_name(u.unit->name(), "adam_v"), st::ElementType::kF32, shape});
  }
  st::Writer w(file, std::move(decls), {{"format", std::string(checkpoint::kFormat)}});
  const size_t psize = dtype_size(dtype_);
  for (const UnitState& u : units_) {
    const size_t n = u.own.count();
    // Where the own range starts in each buffer: at 0 when the buffer holds only it.
    const size_t pfirst = sharding_.parameters ? 0 : u.own.begin;
    const size_t ofirst = u.own.begin - u.opt_range.begin;
    w.write(std::span(static_cast<const std::byte*>(u.params.data()) + pfirst * psize, n * psize));
    if (!fp32) w.write_values(u.master.span().subspan(ofirst, n));
    w.write_values(u.adam_m.span().subspan(ofirst, n));
    w.write_values(u.adam_v.span().subspan(ofirst, n));
  }
  return w.finish();
}

void RankTrainer::check_same_model(const checkpoint::Checkpoint& ckpt) const {
  const checkpoint::Meta& m = ckpt.meta();
  const std::string where = (ckpt.dir() / "meta.json").string();
  if (m.units.size() != units_.size()) {
    // "gpt small", or "mlp" alone: only the gpt has size presets.
    const auto model = [](const std::string& kind, const std::string& size) {
      return size.empty() ? kind : kind + " " + size;
    };
    const std::string saved_size =
        m.model_kind == "gpt" && m.config.count("size") ? m.config.at("size") : "";
    throw CorruptData(
        fmt::format("{}: a checkpoint of another model: {} units there ({}), {} in this run ({})",
                    where, m.units.size(), model(m.model_kind, saved_size), units_.size(),
                    model(cfg_.model, cfg_.model == "gpt" ? cfg_.size : "")));
  }
  for (size_t i = 0; i < units_.size(); ++i) {
    const checkpoint::UnitMeta& saved = m.units[i];
    const Unit& mine = *units_[i].unit;
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

void RankTrainer::load(const checkpoint::Checkpoint& ckpt) {
  const checkpoint::Meta& m = ckpt.meta();
  const bool fp32 = dtype_ == DType::kF32;
  const auto saved_dtype = parse_precision(m.precision);
  std::vector<float> tmp;
  for (size_t i = 0; i < units_.size(); ++i) {
    UnitState& u = units_[i];
    // The 16-bit params are the rounded master; read them as saved when the dtype agrees
    // (the same bits the saving run computed with), else round the master here.
    const Range held = sharding_.parameters ? u.own : Range{0, u.numel};
    if (saved_dtype && param_dtype(*saved_dtype) == dtype_) {
      ckpt.read(
          i, "params", held.begin,
          std::span(static_cast<std::byte*>(u.params.data()), held.count() * dtype_size(dtype_)));
    } else {
      tmp.resize(held.count());
      ckpt.read_master(i, held.begin, tmp);
      narrow(tmp, u.params.data(), dtype_, 0);
    }
    const size_t n = u.opt_range.count();
    if (!fp32) ckpt.read_master(i, u.opt_range.begin, u.master.span());
    ckpt.read(i, "adam_m", u.opt_range.begin, std::as_writable_bytes(u.adam_m.span().first(n)));
    ckpt.read(i, "adam_v", u.opt_range.begin, std::as_writable_bytes(u.adam_v.span().first(n)));
  }
  adam_step_ = m.adam_step;
  if (scaler_) {
    LossScalerState st;
    if (m.loss_scaler) {
      st.scale = static_cast<float>(m.loss_scaler->scale);
      st.clean_steps = m.loss_scaler->clean_steps;
      st.hysteresis_left = m.loss_scaler->hysteresis_left;
    } else {
      st.scale = cfg_.initial_loss_scale;  // from bf16/fp32: a fresh scaler
    }
    try {
      scaler_.emplace(scaler_->config(), st);
    } catch (const InvalidArgument& e) {
      throw CorruptData(
          fmt::format("{}: loss_scaler: {}", (ckpt.dir() / "meta.json").string(), e.what()));
    }
  }
  // The data cursor. With the same samples per step it is exact; otherwise the epoch's
  // samples consumed so far are kept and the step rounds up, so no sample of the epoch is
  // seen twice (the order is the same: it depends on the seed and the epoch only).
  const uint64_t k = sampler_->samples_per_step();
  SamplerPosition pos{m.data_epoch, m.data_step};
  if (m.dataset_size != sampler_->options().dataset_size) {
    throw InvalidArgument(fmt::format(
        "{}: saved with a training set of {} samples, this run's has {}; use the same --data "
        "and sequence length",
        ckpt.dir().string(), m.dataset_size, sampler_->options().dataset_size));
  }
  if (m.samples_per_step != k) {
    const uint64_t consumed = m.data_step * m.samples_per_step;
    pos.step = (consumed + k - 1) / k;
  }
  if (pos.step >= sampler_->steps_per_epoch()) pos = {pos.epoch + 1, 0};
  sampler_->set_position(pos);
}

struct MemorySnapshot {
  MemoryLedger::Table current{};
  MemoryLedger::Table peak{};
  uint64_t peak_total = 0;
  uint64_t gemm_bf16_copies = 0;
};

std::vector<double> pack_summary(const MemorySnapshot& mem, Communicator& comm,
                                 const std::string& samples) {
  std::vector<double> v;
  for (uint64_t x : mem.current) v.push_back(static_cast<double>(x));
  for (uint64_t x : mem.peak) v.push_back(static_cast<double>(x));
  v.push_back(static_cast<double>(mem.peak_total));
  v.push_back(static_cast<double>(mem.gemm_bf16_copies));
  for (auto phase : {CommPhase::kTrain, CommPhase::kOther}) {
    for (const auto& c : comm.ledger().table(phase)) {
      v.push_back(static_cast<double>(c.calls));
      v.push_back(static_cast<double>(c.bytes));
    }
  }
  // The samples digest as 32 bytes.
  for (size_t i = 0; i < 64; i += 2) v.push_back(std::stoi(samples.substr(i, 2), nullptr, 16));
  return v;
}

RankSummary unpack_summary(std::span<const double> v, int rank) {
  RankSummary s;
  s.rank = rank;
  size_t k = 0;
  for (auto& x : s.model_state) x = static_cast<uint64_t>(v[k++]);
  for (auto& x : s.peak) x = static_cast<uint64_t>(v[k++]);
  s.peak_total = static_cast<uint64_t>(v[k++]);
  s.gemm_bf16_copy_bytes = static_cast<uint64_t>(v[k++]);
  for (auto* table : {&s.comm_train, &s.comm_other}) {
    for (auto& c : *table) {
      c.calls = static_cast<uint64_t>(v[k++]);
      c.bytes = static_cast<uint64_t>(v[k++]);
    }
  }
  std::string hex;
  for (int i = 0; i < 32; ++i) hex += fmt::format("{:02x}", static_cast<int>(v[k++]));
  s.samples_sha256 = hex;
  return s;
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
          .val_loss = r.val_loss};
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
  return r;
}

// One checkpoint, every rank taking part (the protocol of checkpoint/store.h). Nothing is
// committed unless every rank's shard is durable; a failure on any rank fails all of them
// with the same verdict, so no rank goes on while another thinks the save was lost.
// `history` (read on rank 0 only) holds the steps up to `step` that the checkpoint carries.
void save_checkpoint(RankTrainer& trainer, Communicator& comm, const TrainConfig& cfg, int64_t step,
                     const std::vector<checkpoint::StepHistory>& history) {
  namespace ck = checkpoint;
  CommPhaseScope phase(comm.ledger(), CommPhase::kOther);
  const Tracer::Span span(trainer.tracer(), "checkpoint", "checkpoint");
  const std::filesystem::path root = cfg.checkpoint_dir;
  const std::filesystem::path temp = ck::temp_dir(root, static_cast<uint64_t>(step));
  const int rank = comm.rank();
  std::string error;
  if (rank == 0) {
    try {
      std::filesystem::remove_all(temp);
      std::filesystem::create_directories(temp);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (comm.sum_control(error.empty() ? 0.0 : 1.0) > 0) {
    if (rank == 0) throw IoError(fmt::format("checkpoint at step {}: {}", step, error));
    throw IoError(
        fmt::format("checkpoint at step {}: rank 0 could not create {}", step, temp.string()));
  }
  std::string sha;
  uint64_t bytes = 0;
  ck::FileMeta history_file;
  const std::filesystem::path file = temp / ck::rank_file_name(rank);
  try {
    if (trainer.injected(Injection::Kind::kIo, step)) {
      throw IoError(fmt::format("cannot write {}: injected failure (--inject io@{}:{})",
                                file.string(), step, rank));
    }
    sha = trainer.write_shard(file);
    bytes = std::filesystem::file_size(file);
    if (rank == 0) history_file = ck::write_history(temp, history);
  } catch (const std::exception& e) {
    error = e.what();
  }
  ck::failpoint("shard-written", rank);
  // Agreement: every rank's verdict, size and digest.
  std::vector<double> mine{error.empty() ? 1.0 : 0.0, static_cast<double>(bytes)};
  for (size_t i = 0; i < 64 && !sha.empty(); i += 2) {
    mine.push_back(std::stoi(sha.substr(i, 2), nullptr, 16));
  }
  mine.resize(2 + 32, 0.0);
  const std::vector<double> all = comm.gather_control(mine);
  std::vector<int> failed;
  ck::Meta meta = trainer.describe(step);
  for (int r = 0; r < comm.size(); ++r) {
    const double* v = all.data() + static_cast<size_t>(r) * mine.size();
    if (v[0] != 1.0) {
      failed.push_back(r);
      continue;
    }
    std::string hex;
    for (int i = 0; i < 32; ++i) hex += fmt::format("{:02x}", static_cast<int>(v[2 + i]));
    meta.files.push_back({ck::rank_file_name(r), static_cast<uint64_t>(v[1]), hex});
  }
  if (rank == 0) meta.files.push_back(history_file);  // rank 0 alone commits
  if (!failed.empty()) {
    throw IoError(
        fmt::format("checkpoint at step {} not committed: rank(s) {} could not write "
                    "their shard{}{}",
                    step, fmt::join(failed, ", "), error.empty() ? "" : ": ", error));
  }
  if (rank == 0) {
    try {
      ck::commit(root, temp, meta, cfg.keep);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (comm.sum_control(error.empty() ? 0.0 : 1.0) > 0) {
    throw IoError(fmt::format("checkpoint at step {} not committed: {}", step,
                              rank == 0 ? error : "rank 0 failed to commit it"));
  }
}

// The error in flight again, of the same type, its message led by the training step (and
// the rank: under MPI the launcher adds it), so every report of a failure says where and
// when it happened.
[[noreturn]] void rethrow_at_step(int64_t step, const Communicator& comm, Backend backend) {
  const std::string where = backend == Backend::kLocal ? fmt::format("rank {} of {}, step {}",
                                                                     comm.rank(), comm.size(), step)
                                                       : fmt::format("step {}", step);
  const auto at = [&where](const std::exception& e) {
    return fmt::format("{}: {}", where, e.what());
  };
  try {
    throw;
  } catch (const CommTimeout& e) {
    throw CommTimeout(at(e), e.failed_rank());
  } catch (const CommError& e) {
    throw CommError(at(e), e.failed_rank());
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(at(e));
  } catch (const CorruptData& e) {
    throw CorruptData(at(e));
  } catch (const OutOfMemory& e) {
    throw OutOfMemory(at(e));
  } catch (const IoError& e) {
    throw IoError(at(e));
  } catch (const std::exception& e) {
    throw Error(at(e));
  }
}

}  // namespace

TrainResult train(const TrainConfig& config, int& argc, char**& argv, const StepCallback& on_step,
                  const ModelFactory& make_model) {
  TrainConfig cfg = config;
  resolve_config(cfg);
  check_launch_environment(cfg.launch);
  check_outputs(cfg);
  const bool local = cfg.launch.backend == Backend::kLocal;
  // Under MPI the rank-0 process takes it, below, once it knows it is rank 0.
  std::optional<CheckpointDirLock> dir_lock;
  if (local) dir_lock.emplace(cfg.checkpoint_dir);
  DataOptions dopt;
  dopt.source = cfg.data;
  dopt.task = cfg.model == "mlp" || cfg.model == "custom-images" ? TaskKind::kImageClassification
                                                                 : TaskKind::kLanguageModel;
  dopt.seq_len = cfg.seq_len;
  dopt.seed = cfg.seed;
  if (!cfg.cache_dir.empty()) dopt.cache_dir = cfg.cache_dir;
  const DataSplits data = open_data(dopt);

  // Where a continuation starts, decided before any rank exists: a missing checkpoint is an
  // error, never a fresh start, and a fresh start never writes over committed checkpoints.
  std::filesystem::path resume_from;
  if (!cfg.resume.empty()) {
    if (cfg.resume == "latest") {
      if (cfg.checkpoint_dir.empty()) {
        throw InvalidArgument("--resume latest needs --checkpoint-dir DIR to look in");
      }
      const auto latest = checkpoint::find_latest(cfg.checkpoint_dir);
      if (!latest) {
        throw InvalidArgument(fmt::format(
            "--resume latest: {} holds no committed checkpoint (no {}/latest); run without "
            "--resume to start fresh",
            cfg.checkpoint_dir, cfg.checkpoint_dir));
      }
      resume_from = *latest;
    } else {
      resume_from = checkpoint::resolve(cfg.resume);
    }
  } else if (!cfg.checkpoint_dir.empty() &&
             !checkpoint::list_checkpoints(cfg.checkpoint_dir).empty()) {
    throw InvalidArgument(fmt::format(
        "--checkpoint-dir {} already holds checkpoints (newest {}); pass --resume latest to "
        "continue from it, or choose an empty directory",
        cfg.checkpoint_dir, checkpoint::list_checkpoints(cfg.checkpoint_dir).back().string()));
  }

  // MFU's two terms, before any rank starts (the calibration wants the cores to itself).
  double flops_per_token = 0;
  {
    const Model m = make_model ? make_model() : build_model(cfg);
    double phi = 0;
    for (const auto& u : m) phi += static_cast<double>(u->numel());
    flops_per_token = cfg.model == "gpt"
                          ? training_flops_per_token(phi, cfg.layers, cfg.seq_len, cfg.embd)
                          : training_flops_per_token(phi);
  }
  const double per_core = gemm_flops_per_core(compute_for(cfg.precision));
  // Local ranks are threads of this process: every one of them is checked here, once,
  // before any thread starts (MPI processes each check themselves below).
  if (local) {
    check_startable_threads(cfg.launch.ranks);
    preflight(cfg, data, make_model, cfg.launch.ranks, 0);
  }
  if (const int signal = stop_requested()) {
    throw Interrupted(fmt::format("interrupted by {} before the first step; nothing was trained",
                                  signal_name(signal)),
                      signal);
  }

  TrainResult result;
  std::mutex mu;
  // --trace: one tracer per rank. Local ranks share one file, written after they finish;
  // MPI ranks each write their own (the path with ".rankR" before the extension).
  std::vector<std::unique_ptr<Tracer>> tracers(
      cfg.launch.backend == Backend::kLocal ? static_cast<size_t>(cfg.launch.ranks) : 1);
  launch(cfg.launch, argc, argv, [&](Communicator& comm) {
    if (!local) preflight(cfg, data, make_model, comm.size(), comm.rank());
    std::optional<CheckpointDirLock> rank0_lock;
    if (!local && comm.rank() == 0) rank0_lock.emplace(cfg.checkpoint_dir);
    Tracer* tracer = nullptr;
    if (!cfg.trace_path.empty()) {
      auto& slot = tracers[cfg.launch.backend == Backend::kLocal ? comm.rank() : 0];
      slot = std::make_unique<Tracer>(comm.rank());
      tracer = slot.get();
      tracer->attach(comm);
    }
    check_same_config(cfg, comm);
    // Every rank verifies the whole checkpoint before any state exists, so a corrupt one
    // fails every rank the same way and before the first collective.
    std::optional<checkpoint::Checkpoint> from;
    if (!resume_from.empty()) from.emplace(resume_from);
    RankTrainer trainer(cfg, comm, data, make_model);
    trainer.set_tracer(tracer);
    int64_t first = 1;
    // The steps every checkpoint of this run carries (rank 0 writes them): the loaded
    // checkpoint's, then this run's, so a report after any number of resumes has them all.
    std::vector<checkpoint::StepHistory> carried;
    if (from) {
      trainer.check_same_model(*from);
      const int64_t saved = static_cast<int64_t>(from->meta().step);
      if (saved > cfg.steps) {
        throw InvalidArgument(fmt::format(
            "--resume {}: the checkpoint is at step {}, past --steps {}; --steps is the total "
            "count, so use --steps {} or more",
            resume_from.string(), saved, cfg.steps, saved));
      }
      trainer.load(*from);
      if (comm.rank() == 0) carried = from->history();
      first = saved + 1;
      from.reset();
    }
    if (comm.rank() == 0 && !cfg.checkpoint_dir.empty()) {
      std::filesystem::create_directories(cfg.checkpoint_dir);
      checkpoint::clean_leftovers(cfg.checkpoint_dir);
    }
    const bool reporter = comm.rank() == 0;
    const size_t earlier = carried.size();
    std::vector<StepRecord> steps;
    // The cores this run's GEMMs occupy: every rank's threads, at most the machine's cores
    // when the ranks share one process.
    // The cores this run's GEMMs occupy: on each host, its ranks' threads, at most the
    // host's cores (ranks past the cores share them and add nothing to the peak).
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    const int local_ranks = ranks_on_this_host(comm, cfg.launch.backend);
    const double hosts = std::ceil(static_cast<double>(comm.size()) / local_ranks);
    const double used = hosts * std::min(static_cast<double>(local_ranks) * gemm_threads(),
                                         static_cast<double>(cores));
    const double peak = per_core * used;
    const int64_t last = cfg.stop_after > 0 ? std::min(cfg.steps, cfg.stop_after) : cfg.steps;
    int64_t streak = 0;  // consecutive skipped steps
    StepRecord streak_start;
    std::optional<EarlyStop> stopped;
    for (int64_t s = first; s <= last && !stopped; ++s) {
      StepRecord rec;
      try {
        {
          const Tracer::Span span(trainer.tracer(), fmt::format("step {}", s), "step");
          rec = trainer.step(s);
        }
        if (rec.skipped) {
          if (streak++ == 0) streak_start = rec;
          if (cfg.max_skips > 0 && streak >= cfg.max_skips) {
            // Every rank took the same verdicts, so every rank stops here; the run's report
            // is still written (the parameters are those of the last good step).
            stopped = EarlyStop{
                .reason = EarlyStop::Reason::kMaxSkips,
                .after_step = s,
                .message = fmt::format(
                    "step {}: {} consecutive steps skipped for non-finite gradients or loss "
                    "(--max-skips {}); the first, step {}, had one in unit {} on rank {}; lower "
                    "--lr, check the data, or pass --max-skips 0 to never stop",
                    s, streak, cfg.max_skips, streak_start.step,
                    streak_start.bad_unit.empty() ? "(the loss)" : streak_start.bad_unit,
                    streak_start.bad_rank)};
          }
        } else {
          streak = 0;
        }
        if (rec.stop_signal != 0 && !stopped && s < last) {
          stopped = EarlyStop{.reason = EarlyStop::Reason::kSignal,
                              .signal = rec.stop_signal,
                              .after_step = s,
                              .message = fmt::format("step {}: interrupted by {}", s,
                                                     signal_name(rec.stop_signal))};
        }
        const bool interrupted = stopped && stopped->reason == EarlyStop::Reason::kSignal;
        if (cfg.eval_every > 0 && s % cfg.eval_every == 0 && s != cfg.steps && !interrupted) {
          CommPhaseScope other(comm.ledger(), CommPhase::kOther);
          rec.val_loss = trainer.evaluate();
        }
        if (reporter) carried.push_back(history_of(rec));
        const bool due = cfg.checkpoint_every > 0 && s % cfg.checkpoint_every == 0;
        if (!cfg.checkpoint_dir.empty() && (due || s == last || interrupted)) {
          save_checkpoint(trainer, comm, cfg, s, carried);
          rec.checkpoint =
              checkpoint::step_dir(cfg.checkpoint_dir, static_cast<uint64_t>(s)).string();
        }
      } catch (...) {
        rethrow_at_step(s, comm, cfg.launch.backend);
      }
      if (peak > 0 && rec.seconds > 0) {
        rec.mfu = flops_per_token * static_cast<double>(rec.tokens) / rec.seconds / peak;
      }
      if (reporter && on_step) on_step(rec, cfg.steps);
      steps.push_back(rec);
    }
    // A continuation with nothing left to train re-saves where it stands: how a checkpoint
    // is resharded to another rank count or stage.
    if (first > last && !cfg.checkpoint_dir.empty()) {
      save_checkpoint(trainer, comm, cfg, first - 1, carried);
    }
    // Memory as training left it; the evaluation and hash below are not training.
    const MemorySnapshot mem{trainer.ledger().current_table(), trainer.ledger().peak_table(),
                             trainer.ledger().peak_total(), gemm_bf16_copy_bytes()};
    CommPhaseScope other(comm.ledger(), CommPhase::kOther);
    // An interrupted run ends as soon as it can: mpirun, for one, kills its processes
    // shortly after forwarding the signal.
    const bool interrupted = stopped && stopped->reason == EarlyStop::Reason::kSignal;
    const double val = interrupted ? std::nan("") : trainer.evaluate();
    std::vector<float> kept;
    const std::string weights =
        trainer.weights_sha256(cfg.keep_final_weights && reporter ? &kept : nullptr);
    const std::vector<double> mine = pack_summary(mem, comm, trainer.samples_sha256());
    // Snapshot taken: the gather below is the last collective and is not in the summary.
    const std::vector<double> all = comm.gather_control(mine);
    if (tracer != nullptr) {
      comm.set_trace_hook(nullptr);
      if (cfg.launch.backend == Backend::kMpi) {
        std::filesystem::path p(cfg.trace_path);
        p.replace_filename(
            fmt::format("{}.rank{}{}", p.stem().string(), comm.rank(), p.extension().string()));
        const Tracer* one[] = {tracer};
        write_trace(p, one);
      }
    }
    std::lock_guard lock(mu);
    result.stopped = stopped;  // every rank's is the same, and every process needs it
    if (!reporter) return;
    result.is_reporter = true;
    result.config = cfg;
    result.params = trainer.params();
    result.world_size = comm.size();
    result.backend = std::string(comm.backend_name());
    result.data_description = data.description;
    result.steps = steps;
    for (size_t i = 0; i < earlier; ++i) result.history.push_back(record_of(carried[i]));
    result.final_loss = steps.empty() ? std::nan("") : steps.back().loss;
    result.resumed_from = resume_from.string();
    result.first_step = first;
    if (std::isfinite(val)) result.val_loss = val;
    result.weights_sha256 = weights;
    result.final_weights = std::move(kept);
    for (int r = 0; r < comm.size(); ++r) {
      result.ranks.push_back(unpack_summary(
          std::span<const double>(all).subspan(static_cast<size_t>(r) * mine.size(), mine.size()),
          r));
    }
    for (const auto& u : trainer.model()) {
      result.unit_names.push_back(u->name());
      result.unit_numel.push_back(u->numel());
    }
    std::vector<double> secs;
    uint64_t tokens = 0;
    double total = 0;
    for (const auto& st : steps) {
      secs.push_back(st.seconds);
      tokens += st.tokens;
      total += st.seconds;
    }
    std::sort(secs.begin(), secs.end());
    result.step_seconds_median = secs.empty() ? 0 : secs[secs.size() / 2];
    result.tokens_per_second = total > 0 ? static_cast<double>(tokens) / total : 0;
    result.flops_per_token = flops_per_token;
    result.peak_flops = peak;
    result.peak_cores = used;
    result.mfu = peak > 0 ? flops_per_token * result.tokens_per_second / peak : 0;
    rusage usage{};
    if (getrusage(RUSAGE_SELF, &usage) == 0) {
      result.process_peak_rss_bytes = static_cast<uint64_t>(usage.ru_maxrss) * 1024;  // KiB
    }
    // Written here, before MPI is finalized: under mpirun a job being stopped may not get
    // past the finalize before the launcher's SIGKILL, and the report must not be lost.
    if (!cfg.report_path.empty()) {
      files::write_output("--report", cfg.report_path, report_json(result).dump(2) + "\n");
    }
  });
  if (!cfg.trace_path.empty() && cfg.launch.backend == Backend::kLocal) {
    std::vector<const Tracer*> all;
    for (const auto& t : tracers) all.push_back(t.get());
    write_trace(cfg.trace_path, all);
  }
  return result;
}

}  // namespace zerodp
