// gemm: fixed tiles of single-threaded dnnl_sgemm calls, spread over a per-thread pool.
//
// Why not let oneDNN thread: its OpenMP partitioning may split K and so changes bits with
// the thread count (gemm.h). Why a pool of std::threads rather than an OpenMP region: the
// tiles must run single-threaded inside oneDNN whatever team we are in, the pool's size is a
// per-rank-thread setting, and this keeps OpenMP compile flags out of the library; oneDNN's
// own OpenMP runtime (libgomp) is only told "1 thread" on every thread that calls it.
#include "tensor/gemm.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string_view>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/mutex.h"
#include "tensor/dtype.h"

namespace zerodp {
namespace {

// Tiling. A tile is halved, along its longer side, while it holds more than kMaxTileFlops
// and that side stays >= kMinTileDim after halving. Each tile is a separate dnnl_sgemm that
// packs its own slices of A and B, so tiles cost a little: measured on this machine (Zen 5,
// best of 60 calls, the GPT shapes of bench_gemm), 256-wide tiles of >= 32 MFLOP run within
// 0-8% of one whole call on one core, 128-wide tiles of 16 MFLOP 5-15%. The GPT-small
// products still give 2-4 tiles, enough for 2 threads; power-of-two part counts keep 2, 4
// and 8 threads balanced.
constexpr double kMaxTileFlops = 32e6;
constexpr size_t kMinTileDim = 256;
// Tile edges fall on multiples of this many rows/columns (the kernel's register blocks).
constexpr size_t kTileAlign = 16;
constexpr int kMaxGemmThreads = 256;

struct Tiling {
  size_t parts_m = 1;  // C's rows are cut into parts_m row blocks,
  size_t parts_n = 1;  // its columns into parts_n column blocks.
  size_t count() const { return parts_m * parts_n; }
};

Tiling tiling_for(size_t M, size_t N, size_t K) {
  Tiling t;
  auto tile_m = [&] { return (M + t.parts_m - 1) / t.parts_m; };
  auto tile_n = [&] { return (N + t.parts_n - 1) / t.parts_n; };
  while (2.0 * static_cast<double>(tile_m()) * static_cast<double>(tile_n()) *
             static_cast<double>(K) >
         kMaxTileFlops) {
    const bool can_m = tile_m() >= 2 * kMinTileDim;
    const bool can_n = tile_n() >= 2 * kMinTileDim;
    if (!can_m && !can_n) break;
    if (can_m && (tile_m() >= tile_n() || !can_n)) {
      t.parts_m *= 2;
    } else {
      t.parts_n *= 2;
    }
  }
  return t;
}

struct Block {
  size_t begin = 0;
  size_t count = 0;
};

// Part i of p of a dimension of length d: equal aligned blocks, the last one takes the rest.
Block part_of(size_t d, size_t p, size_t i) {
  if (p == 1) return {0, d};
  const size_t base = d / p / kTileAlign * kTileAlign;  // > 0: parts are cut at >= ~256
  const size_t begin = i * base;
  const size_t end = i + 1 == p ? d : begin + base;
  return {begin, end - begin};
}

struct GemmArgs {
  // bf16 compute: a16/b16 hold A and B rounded, in their stored layout with no row padding
  // (row strides lda16/ldb16).
  bool bf16 = false;
  const BFloat16* a16 = nullptr;
  const BFloat16* b16 = nullptr;
  size_t lda16 = 0, ldb16 = 0;
  BFloat16* c16 = nullptr;  // C written in bf16 (row stride ldc) instead of c
  char trans_a;
  char trans_b;
  size_t M, N, K;
  float alpha;
  const float* a;
  size_t lda;
  const float* b;
  size_t ldb;
  float beta;
  float* c;
  size_t ldc;
  const float* bias;  // N values, or null
};

// A tile's rows of C set to the bias (columns cb), for the product to add onto with beta = 1:
// while the tile is about to be used, not as a pass over all of C first.
void start_rows_at_bias(const GemmArgs& g, Block rb, Block cb, float* c) {
  for (size_t i = 0; i < rb.count; ++i) std::copy_n(g.bias + cb.begin, cb.count, c + i * g.ldc);
}

// bf16 tiles: oneDNN's matmul primitive on the rounded operands, fp32 accumulation and
// output, alpha as an output scale, beta as a sum post-op and the bias as the primitive's
// bias argument (broadcast over rows). A transposed operand is described by its strides, not
// copied. Primitives are created once per key on each thread that runs tiles, and kept: a
// training step repeats the same few shapes.
struct MatmulKey {
  size_t m, n, k, lda16, ldb16, ldc;
  char trans_a, trans_b;
  float alpha, beta;
  bool bias;
  auto operator<=>(const MatmulKey&) const = default;
};

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// A bf16 C's tile in fp32, on whichever thread runs the tile (run_tile_bf16); kept between
// calls like the rounded operands.
thread_local std::vector<float> t_tile32;

size_t gemm_batched_copy_bytes();  // (defined with gemm_batched, below)

dnnl_status_t run_tile_bf16(const GemmArgs& g, Block rb, Block cb) {
  thread_local std::map<MatmulKey, dnnl::matmul> cache;
  using dim = dnnl::memory::dim;
  using dims = dnnl::memory::dims;
  using dt = dnnl::memory::data_type;
  const bool ta = g.trans_a == 'T';
  const bool tb = g.trans_b == 'T';
  const auto lda = static_cast<dim>(g.lda16);
  const auto ldb = static_cast<dim>(g.ldb16);
  // op(A)'s rows rb: rows of A, or columns of A stored (K, M). op(B)'s columns cb likewise.
  const dnnl::memory::desc a_md(dims{static_cast<dim>(rb.count), static_cast<dim>(g.K)}, dt::bf16,
                                ta ? dims{1, lda} : dims{lda, 1});
  const dnnl::memory::desc b_md(dims{static_cast<dim>(g.K), static_cast<dim>(cb.count)}, dt::bf16,
                                tb ? dims{1, ldb} : dims{ldb, 1});
  // A bf16 C: the tile's fp32 result in a kept buffer, then rounded by convert(), never by
  // oneDNN's own conversion (vcvtneps2bf16 flushes subnormals; convert() keeps them).
  const size_t ldc = g.c16 != nullptr ? cb.count : g.ldc;
  const dnnl::memory::desc c_md(dims{static_cast<dim>(rb.count), static_cast<dim>(cb.count)},
                                dt::f32, dims{static_cast<dim>(ldc), 1});
  const dnnl::memory::desc bias_md(dims{1, static_cast<dim>(cb.count)}, dt::f32,
                                   dnnl::memory::format_tag::ab);
  const BFloat16* a = ta ? g.a16 + rb.begin : g.a16 + rb.begin * g.lda16;
  const BFloat16* b = tb ? g.b16 + cb.begin * g.ldb16 : g.b16 + cb.begin;
  if (g.c16 != nullptr) t_tile32.resize(rb.count * cb.count);
  float* c = g.c16 != nullptr ? t_tile32.data() : g.c + rb.begin * g.ldc + cb.begin;
  // oneDNN scales (product + bias) by the output scale, so with alpha != 1 the bias goes into
  // the tile first and the product adds onto it, as on the fp32 path (gemm() never sends a
  // bf16 C here with a bias and alpha != 1).
  const bool bias_arg = g.bias != nullptr && g.alpha == 1.0f;
  float beta = g.beta;
  if (g.bias != nullptr && !bias_arg) {
    start_rows_at_bias(g, rb, cb, c);
    beta = 1.0f;
  }
  try {
    const MatmulKey key{rb.count,  cb.count,  g.K,     g.lda16, g.ldb16, ldc,
                        g.trans_a, g.trans_b, g.alpha, beta,    bias_arg};
    auto it = cache.find(key);
    if (it == cache.end()) {
      if (cache.size() >= 256) cache.clear();
      dnnl::primitive_attr attr;
      if (g.alpha != 1.0f) attr.set_output_scales(0, {g.alpha});
      if (beta != 0.0f) {
        dnnl::post_ops ops;
        ops.append_sum(beta);
        attr.set_post_ops(ops);
      }
      const dnnl::matmul::desc desc = bias_arg ? dnnl::matmul::desc(a_md, b_md, bias_md, c_md)
                                               : dnnl::matmul::desc(a_md, b_md, c_md);
      const dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
      it = cache.emplace(key, dnnl::matmul(pd)).first;
    }
    thread_local dnnl::stream stream(cpu_engine());
    dnnl::memory am(a_md, cpu_engine(), const_cast<BFloat16*>(a));
    dnnl::memory bm(b_md, cpu_engine(), const_cast<BFloat16*>(b));
    dnnl::memory cm(c_md, cpu_engine(), c);
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
    if (bias_arg) {
      args.emplace(DNNL_ARG_BIAS,
                   dnnl::memory(bias_md, cpu_engine(), const_cast<float*>(g.bias + cb.begin)));
    }
    it->second.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& e) {
    return e.status;
  }
  if (g.c16 != nullptr) {
    for (size_t r = 0; r < rb.count; ++r) {
      convert(std::span<const float>(c + r * cb.count, cb.count),
              std::span<BFloat16>(g.c16 + (rb.begin + r) * g.ldc + cb.begin, cb.count));
    }
  }
  return dnnl_success;
}

// One tile: rows rb of C and columns cb, all of K, as one single-threaded dnnl_sgemm.
dnnl_status_t run_tile(const GemmArgs& g, Block rb, Block cb) {
  if (g.bf16) return run_tile_bf16(g, rb, cb);
  // Row block of op(A): rows of A, or columns of A when A is stored transposed (K, M).
  const float* a = g.trans_a == 'N' ? g.a + rb.begin * g.lda : g.a + rb.begin;
  // Column block of op(B): columns of B, or rows of B when B is stored transposed (N, K).
  const float* b = g.trans_b == 'N' ? g.b + cb.begin : g.b + cb.begin * g.ldb;
  float* c = g.c + rb.begin * g.ldc + cb.begin;
  float beta = g.beta;
  if (g.bias != nullptr) {
    start_rows_at_bias(g, rb, cb, c);
    beta = 1.0f;
  }
  return dnnl_sgemm(g.trans_a, g.trans_b, static_cast<dnnl_dim_t>(rb.count),
                    static_cast<dnnl_dim_t>(cb.count), static_cast<dnnl_dim_t>(g.K), g.alpha, a,
                    static_cast<dnnl_dim_t>(g.lda), b, static_cast<dnnl_dim_t>(g.ldb), beta, c,
                    static_cast<dnnl_dim_t>(g.ldc));
}

// What a TilePool runs: work() is called on the caller and on every helper, and each call
// claims parts of the job until none are left.
struct PoolJob {
  virtual void work() = 0;

  std::atomic<int> status{dnnl_success};  // the first failure, if any

 protected:
  ~PoolJob() = default;
  // Claims parts 0..count-1 from an atomic counter until none are left, running each with
  // run_part(i): which thread runs a part does not matter for the result.
  template <typename RunPart>
  void claim_parts(size_t count, RunPart run_part) {
    for (size_t i = next_.fetch_add(1); i < count; i = next_.fetch_add(1)) {
      const dnnl_status_t s = run_part(i);
      if (s != dnnl_success) {
        int expected = dnnl_success;
        status.compare_exchange_strong(expected, s);
      }
    }
  }

 private:
  std::atomic<size_t> next_{0};
};

// The work of one gemm() call, shared by the caller and its helpers: its tiles.
struct Job final : PoolJob {
  const GemmArgs* args = nullptr;
  Tiling tiling;

  void work() override {
    claim_parts(tiling.count(), [this](size_t i) {
      return run_tile(*args, part_of(args->M, tiling.parts_m, i / tiling.parts_n),
                      part_of(args->N, tiling.parts_n, i % tiling.parts_n));
    });
  }
};

// oneDNN (OpenMP build) sizes its team from omp_get_max_threads() of the calling thread.
// Tiles must run on exactly one thread, so set 1 for the duration and restore the caller's
// value: a rank thread's own OpenMP use, if any, is left as it was.
class SingleThreadedOneDnn {
 public:
  SingleThreadedOneDnn() : saved_(omp_get_max_threads()) {
    if (saved_ != 1) omp_set_num_threads(1);
  }
  ~SingleThreadedOneDnn() {
    if (saved_ != 1) omp_set_num_threads(saved_);
  }
  SingleThreadedOneDnn(const SingleThreadedOneDnn&) = delete;
  SingleThreadedOneDnn& operator=(const SingleThreadedOneDnn&) = delete;

 private:
  int saved_;
};

// Helper threads owned by one calling thread. The helpers block on a condition variable
// between calls (no spinning): rank threads share the cores, and a spinning helper would
// take cycles from another rank's gemm (measured in bench_gemm, "ranks" rows).
class TilePool {
 public:
  explicit TilePool(int helpers) {
    threads_.reserve(static_cast<size_t>(helpers));
    for (int i = 0; i < helpers; ++i) threads_.emplace_back([this] { helper_loop(); });
  }
  ~TilePool() {
    {
      MutexLock lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  TilePool(const TilePool&) = delete;
  TilePool& operator=(const TilePool&) = delete;

  int helpers() const { return static_cast<int>(threads_.size()); }

  // Runs job on the caller and every helper; returns when all have left it.
  void run(PoolJob& job) {
    {
      MutexLock lock(mu_);
      job_ = &job;
      busy_ = static_cast<int>(threads_.size());
      ++generation_;
    }
    wake_.notify_all();
    job.work();
    MutexLock lock(mu_);
    while (busy_ != 0) done_.wait(mu_);
    job_ = nullptr;
  }

 private:
  void helper_loop() {
    omp_set_num_threads(1);  // this thread only ever runs single-threaded tiles
    uint64_t seen = 0;
    for (;;) {
      PoolJob* job = nullptr;
      {
        MutexLock lock(mu_);
        while (!stop_ && generation_ == seen) wake_.wait(mu_);
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      job->work();
      MutexLock lock(mu_);
      if (--busy_ == 0) done_.notify_one();
    }
  }

  Mutex mu_;
  CondVar wake_;                             // a new job or stop
  CondVar done_;                             // busy_ reached 0
  uint64_t generation_ GUARDED_BY(mu_) = 0;  // bumped per job, so a helper runs each job once
  int busy_ GUARDED_BY(mu_) = 0;             // helpers still inside the current job
  bool stop_ GUARDED_BY(mu_) = false;
  PoolJob* job_ GUARDED_BY(mu_) = nullptr;
  std::vector<std::thread> threads_;
};

thread_local int t_gemm_threads = 1;

// A stored (rows, cols) matrix with row stride ld, rounded to bf16 row by row (tensor/dtype's
// rounding, vectorized) into `out` with row stride cols.
void round_rows(std::vector<BFloat16>& out, const float* x, size_t rows, size_t cols, size_t ld) {
  out.resize(rows * cols);
  for (size_t r = 0; r < rows; ++r) {
    convert(std::span<const float>(x + r * ld, cols),
            std::span<BFloat16>(out).subspan(r * cols, cols));
  }
}

bool cpu_has_bf16() {
  static const bool has = [] {
    if (const char* force = std::getenv("ZERODP_GEMM_BF16");
        force && std::string_view(force) == "fallback") {
      return false;
    }
    return dnnl_get_effective_cpu_isa() >= dnnl_cpu_isa_avx512_core_bf16;
  }();
  return has;
}
thread_local std::unique_ptr<TilePool> t_pool;

// Runs a job of `parts` independent parts on the calling thread, with its pool's helpers
// when it has asked for more than one thread and there is more than one part.
void run_parts(PoolJob& job, size_t parts) {
  if (parts == 1 || t_gemm_threads == 1) {
    job.work();
    return;
  }
  if (!t_pool || t_pool->helpers() != t_gemm_threads - 1) {
    t_pool.reset();
    t_pool = std::make_unique<TilePool>(t_gemm_threads - 1);
  }
  t_pool->run(job);
}

// The calling thread's live Bf16Operands scopes, innermost last. A lazily rounded copy lives
// in the slot's own vector, kept between scopes so that a training step, which opens the
// same scopes every time, allocates nothing after its first.
struct Bf16Slot {
  const float* values = nullptr;
  size_t count = 0;
  const BFloat16* rounded = nullptr;  // null until a product first reads the buffer
  std::vector<BFloat16> own;
};
thread_local Bf16Slot t_bf16_slots[kMaxBf16Operands];
thread_local int t_bf16_depth = 0;

// Operands a kBF16 product rounds itself (no scope holds them), and their widened copies on
// the fallback path; kept from call to call like the slots' copies.
thread_local std::vector<BFloat16> t_round_a16, t_round_b16;
thread_local std::vector<float> t_round_a32, t_round_b32;
// A bf16 C's fp32 product where the primitive cannot write bf16 directly (gemm()).
thread_local std::vector<float> t_result32;

// The innermost live GemmRecording's shapes on this thread, or null.
thread_local std::vector<GemmShape>* t_recording = nullptr;

// The bf16 copy of the `count` elements at p, if a live scope's buffer holds all of them.
const BFloat16* scoped_bf16(const float* p, size_t count) {
  const auto begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t end = begin + count * sizeof(float);
  for (int i = t_bf16_depth - 1; i >= 0; --i) {
    Bf16Slot& s = t_bf16_slots[i];
    const auto first = reinterpret_cast<uintptr_t>(s.values);
    if (begin < first || end > first + s.count * sizeof(float)) continue;
    if (s.rounded == nullptr) {
      s.own.resize(s.count);
      convert(std::span<const float>(s.values, s.count), std::span<BFloat16>(s.own));
      s.rounded = s.own.data();
    }
    return s.rounded + (p - s.values);
  }
  return nullptr;
}

// Elements a row-major (rows, cols) matrix with row stride ld spans; 0 if it is empty.
size_t extent(size_t rows, size_t cols, size_t ld) {
  if (rows == 0 || cols == 0) return 0;
  size_t span = 0;
  if (__builtin_mul_overflow(rows - 1, ld, &span) || __builtin_add_overflow(span, cols, &span)) {
    throw InvalidArgument(
        fmt::format("gemm: a ({}, {}) matrix with row stride {} overflows size_t", rows, cols, ld));
  }
  return span;
}

void check_operand(const char* name, size_t length, size_t rows, size_t cols, size_t ld,
                   const char* shape) {
  if (ld < cols) {
    throw InvalidArgument(fmt::format(
        "gemm: ld{} = {} is less than the {} columns of {} as stored ({}); use ld{} >= {}", name,
        ld, cols, name, shape, name, cols));
  }
  const size_t need = extent(rows, cols, ld);
  if (length < need) {
    throw InvalidArgument(fmt::format(
        "gemm: {} holds {} elements, but {} stored as ({}, {}) with ld{} = {} spans {} ({})", name,
        length, name, rows, cols, name, ld, need, shape));
  }
}

// The bytes an operand or result of `count` elements starting at p occupies.
struct Bytes {
  uintptr_t begin = 0;
  size_t size = 0;
};
Bytes bytes_of(const GemmOperand& x, size_t count) {
  return x.is_bf16() ? Bytes{reinterpret_cast<uintptr_t>(x.bf16().data()), count * sizeof(BFloat16)}
                     : Bytes{reinterpret_cast<uintptr_t>(x.f32().data()), count * sizeof(float)};
}
Bytes bytes_of(const GemmResult& x, size_t count) {
  return x.is_bf16() ? Bytes{reinterpret_cast<uintptr_t>(x.bf16().data()), count * sizeof(BFloat16)}
                     : Bytes{reinterpret_cast<uintptr_t>(x.f32().data()), count * sizeof(float)};
}

bool overlaps(Bytes p, Bytes q) {
  if (p.size == 0 || q.size == 0) return false;
  return p.begin < q.begin + q.size && q.begin < p.begin + p.size;
}

// What gemm() and gemm_batched ask of bf16 storage: bf16 compute, and a bf16 C only written.
void check_storage(std::string_view fn, GemmCompute compute, const GemmOperand& a,
                   const GemmOperand& b, const GemmResult& c, float beta) {
  if (compute != GemmCompute::kBF16 && (a.is_bf16() || b.is_bf16() || c.is_bf16())) {
    throw InvalidArgument(fmt::format(
        "{}: {} is bf16 but compute is fp32; bf16 operands and results need GemmCompute::kBF16", fn,
        a.is_bf16() ? "a" : (b.is_bf16() ? "b" : "c")));
  }
  if (c.is_bf16() && beta != 0.0f) {
    throw InvalidArgument(fmt::format(
        "{}: c is bf16 and beta is {}; a bf16 c is only written, so beta must be 0", fn, beta));
  }
}

void throw_dnnl(dnnl_status_t s, size_t M, size_t N, size_t K) {
  throw Error(fmt::format("gemm: dnnl_sgemm failed with status {} for M={} N={} K={}",
                          static_cast<int>(s), M, N, K));
}

// A stored (rows, cols) bf16 matrix with row stride ld, widened into `out` with row stride cols.
void widen_rows(std::vector<float>& out, const BFloat16* x, size_t rows, size_t cols, size_t ld) {
  out.resize(rows * cols);
  for (size_t r = 0; r < rows; ++r) {
    convert(std::span<const BFloat16>(x + r * ld, cols),
            std::span<float>(out).subspan(r * cols, cols));
  }
}

// bf16 compute on AVX-512 BF16: an operand's bf16 values and row stride (stored, scoped, own).
std::pair<const BFloat16*, size_t> bf16_operand(std::vector<BFloat16>& own, const GemmOperand& x,
                                                size_t count, size_t rows, size_t cols, size_t ld) {
  if (x.is_bf16()) return {x.bf16().data(), ld};
  if (const BFloat16* scoped = scoped_bf16(x.f32().data(), count)) return {scoped, ld};
  round_rows(own, x.f32().data(), rows, cols, ld);
  return {own.data(), cols};
}

// bf16 compute without AVX-512 BF16: an operand's bf16 values as fp32, row stride cols.
const float* bf16_values_as_f32(std::vector<BFloat16>& own16, std::vector<float>& own32,
                                const GemmOperand& x, size_t rows, size_t cols, size_t ld) {
  if (x.is_bf16()) {
    widen_rows(own32, x.bf16().data(), rows, cols, ld);
  } else {
    round_rows(own16, x.f32().data(), rows, cols, ld);
    own32.resize(own16.size());
    convert(std::span<const BFloat16>(own16), std::span<float>(own32));
  }
  return own32.data();
}

// C's rows when the product is skipped (K == 0 or alpha == 0; BLAS semantics oneDNN does not
// follow for K == 0, where it leaves C alone whatever beta is).
void skipped_product(size_t M, size_t N, float beta, const GemmResult& c, size_t ldc,
                     std::span<const float> bias) {
  for (size_t i = 0; i < M; ++i) {
    if (c.is_bf16()) {
      const std::span<BFloat16> row = c.bf16().subspan(i * ldc, N);
      if (bias.empty()) {
        std::fill(row.begin(), row.end(), BFloat16{});
      } else {
        convert(bias, row);
      }
      continue;
    }
    float* row = c.f32().data() + i * ldc;
    if (!bias.empty()) {
      std::copy(bias.begin(), bias.end(), row);
    } else if (beta == 0.0f) {
      std::fill(row, row + N, 0.0f);
    } else if (beta != 1.0f) {
      for (size_t j = 0; j < N; ++j) row[j] *= beta;
    }
  }
}

}  // namespace

void gemm(GemmCompute compute, Transpose trans_a, Transpose trans_b, size_t M, size_t N, size_t K,
          float alpha, GemmOperand a, size_t lda, GemmOperand b, size_t ldb, float beta,
          GemmResult c, size_t ldc, std::span<const float> bias) {
  const bool ta = trans_a == Transpose::kYes;
  const bool tb = trans_b == Transpose::kYes;
  const size_t a_rows = ta ? K : M, a_cols = ta ? M : K;
  const size_t b_rows = tb ? N : K, b_cols = tb ? K : N;
  check_operand("a", a.size(), a_rows, a_cols, lda, ta ? "A^T: K x M" : "M x K");
  check_operand("b", b.size(), b_rows, b_cols, ldb, tb ? "B^T: N x K" : "K x N");
  check_operand("c", c.size(), M, N, ldc, "M x N");
  if (!bias.empty() && (bias.size() != N || beta != 0.0f)) {
    throw InvalidArgument(fmt::format(
        "gemm: bias holds {} values with beta = {}; a bias needs N = {} values and beta = 0",
        bias.size(), beta, N));
  }
  check_storage("gemm", compute, a, b, c, beta);
  if (t_recording != nullptr) t_recording->push_back({trans_a, trans_b, M, N, K});
  if (M == 0 || N == 0) return;

  const size_t c_count = extent(M, N, ldc);
  const size_t a_count = extent(a_rows, a_cols, lda);
  const size_t b_count = extent(b_rows, b_cols, ldb);
  const Bytes c_bytes = bytes_of(c, c_count);
  if (overlaps(c_bytes, bytes_of(a, a_count)) || overlaps(c_bytes, bytes_of(b, b_count))) {
    throw InvalidArgument(
        fmt::format("gemm: c overlaps a or b (M={} N={} K={}); write the product to a separate "
                    "buffer",
                    M, N, K));
  }
  if (K == 0 || alpha == 0.0f) {
    skipped_product(M, N, beta, c, ldc, bias);
    return;
  }

  GemmArgs args{.trans_a = ta ? 'T' : 'N',
                .trans_b = tb ? 'T' : 'N',
                .M = M,
                .N = N,
                .K = K,
                .alpha = alpha,
                .a = a.f32().data(),
                .lda = lda,
                .b = b.f32().data(),
                .ldb = ldb,
                .beta = beta,
                .c = c.f32().data(),
                .ldc = ldc,
                .bias = bias.empty() ? nullptr : bias.data()};
  // A bf16 C goes through an fp32 copy of the product when the primitive cannot write it
  // directly: on the fallback path, and with a bias under alpha != 1 (oneDNN would scale the
  // bias too). Rounded row by row at the end, the same rounding either way.
  bool c_via_f32 = false;
  // bf16 compute: fp32 operands rounded once per call, in their stored layout (by the calling
  // thread, before any tile runs), unless a Bf16Operands scope holds them rounded already;
  // bf16 operands read as stored. Without AVX-512 BF16 the rounded values, widened back, go
  // through the fp32 path: the same operand values, fp32 products of them (scopes are not
  // consulted there).
  if (compute == GemmCompute::kBF16) {
    if (cpu_has_bf16()) {
      args.bf16 = true;
      std::tie(args.a16, args.lda16) = bf16_operand(t_round_a16, a, a_count, a_rows, a_cols, lda);
      std::tie(args.b16, args.ldb16) = bf16_operand(t_round_b16, b, b_count, b_rows, b_cols, ldb);
      if (c.is_bf16()) {
        c_via_f32 = !bias.empty() && alpha != 1.0f;
        if (!c_via_f32) args.c16 = c.bf16().data();
      }
    } else {
      args.a = bf16_values_as_f32(t_round_a16, t_round_a32, a, a_rows, a_cols, lda);
      args.lda = a_cols;
      args.b = bf16_values_as_f32(t_round_b16, t_round_b32, b, b_rows, b_cols, ldb);
      args.ldb = b_cols;
      c_via_f32 = c.is_bf16();
    }
  }
  if (c_via_f32) {
    t_result32.resize(M * N);
    args.c = t_result32.data();
    args.ldc = N;
  }
  Job job;
  job.args = &args;
  job.tiling = tiling_for(M, N, K);
  SingleThreadedOneDnn single;
  run_parts(job, job.tiling.count());
  const auto status = static_cast<dnnl_status_t>(job.status.load());
  if (status != dnnl_success) throw_dnnl(status, M, N, K);
  if (c_via_f32) {
    for (size_t r = 0; r < M; ++r) {
      convert(std::span<const float>(t_result32).subspan(r * N, N), c.bf16().subspan(r * ldc, N));
    }
  }
}

void set_gemm_threads(int threads) {
  if (threads < 1 || threads > kMaxGemmThreads) {
    throw InvalidArgument(fmt::format(
        "set_gemm_threads: {} threads requested; use 1..{} (1 = the calling thread only)", threads,
        kMaxGemmThreads));
  }
  t_gemm_threads = threads;
  if (threads == 1) t_pool.reset();
}

int gemm_threads() { return t_gemm_threads; }

Bf16Operands::Bf16Operands(GemmCompute compute, std::span<const float> values,
                           std::span<const BFloat16> rounded) {
  if (!rounded.empty() && rounded.size() != values.size()) {
    throw InvalidArgument(fmt::format(
        "Bf16Operands: {} rounded values given for {} fp32 values; give one per value, or none",
        rounded.size(), values.size()));
  }
  if (compute != GemmCompute::kBF16 || values.empty()) return;
  if (t_bf16_depth == kMaxBf16Operands) {
    throw InvalidArgument(
        fmt::format("Bf16Operands: {} scopes already live on this thread; at most {} may nest",
                    t_bf16_depth, kMaxBf16Operands));
  }
  Bf16Slot& s = t_bf16_slots[t_bf16_depth++];
  s.values = values.data();
  s.count = values.size();
  s.rounded = rounded.empty() ? nullptr : rounded.data();
  active_ = true;
}

Bf16Operands::~Bf16Operands() {
  if (active_) --t_bf16_depth;
}

size_t gemm_bf16_copy_bytes() {
  size_t bytes =
      (t_round_a16.capacity() + t_round_b16.capacity()) * sizeof(BFloat16) +
      (t_round_a32.capacity() + t_round_b32.capacity() + t_result32.capacity()) * sizeof(float);
  for (const Bf16Slot& slot : t_bf16_slots) bytes += slot.own.capacity() * sizeof(BFloat16);
  return bytes + t_tile32.capacity() * sizeof(float) + gemm_batched_copy_bytes();
}

bool gemm_bf16_native() { return cpu_has_bf16(); }

std::vector<GemmShape> distinct_shapes(std::vector<GemmShape> shapes) {
  std::sort(shapes.begin(), shapes.end());
  shapes.erase(std::unique(shapes.begin(), shapes.end()), shapes.end());
  return shapes;
}

GemmRecording::GemmRecording() : outer_(t_recording) { t_recording = &shapes_; }
GemmRecording::~GemmRecording() { t_recording = outer_; }

size_t gemm_tile_count(size_t M, size_t N, size_t K) { return tiling_for(M, N, K).count(); }

// ---- gemm_batched ----
//
// One call: the operands are normalized first (on the calling thread) to one element type
// the primitive multiplies, bf16 for kBF16 on the oneDNN bf16 path and fp32 otherwise, each
// either the caller's own memory with its strides or a kept copy packed densely; then the
// batch is cut into parts (rectangles of the (outer, inner) entries), each one matmul
// primitive execution on one thread.
namespace {

// Parts of a batch: halved, along the dimension with more entries per part, while a part
// holds more than kMaxTileFlops (gemm()'s tile size) and has 2 entries or more along it.
struct BatchParts {
  size_t parts_o = 1;
  size_t parts_i = 1;
  size_t count() const { return parts_o * parts_i; }
};

BatchParts batch_parts_for(size_t M, size_t N, size_t K, size_t outer, size_t inner) {
  BatchParts p;
  const double entry =
      2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  auto piece_o = [&] { return (outer + p.parts_o - 1) / p.parts_o; };
  auto piece_i = [&] { return (inner + p.parts_i - 1) / p.parts_i; };
  while (static_cast<double>(piece_o() * piece_i()) * entry > kMaxTileFlops) {
    const bool can_o = piece_o() >= 2;
    const bool can_i = piece_i() >= 2;
    if (!can_o && !can_i) break;
    if (can_o && (piece_o() >= piece_i() || !can_i)) {
      p.parts_o = std::min(2 * p.parts_o, outer);
    } else {
      p.parts_i = std::min(2 * p.parts_i, inner);
    }
  }
  return p;
}

// Entries [begin, begin + count) of part i of p along a dimension of d entries.
Block batch_range(size_t d, size_t p, size_t i) {
  const size_t begin = i * d / p;
  return {begin, (i + 1) * d / p - begin};
}

using dt = dnnl::memory::data_type;

// An operand as the primitive reads it: first element, type, row stride and batch strides
// (0: one matrix read by every entry along that dimension).
struct BatchedOperand {
  const void* data = nullptr;
  dt type = dt::f32;
  size_t ld = 0, outer = 0, inner = 0;
};

struct BatchedArgs {
  bool ta = false, tb = false;
  size_t M = 0, N = 0, K = 0;
  float alpha = 1.0f, beta = 0.0f;
  BatchedOperand a, b;
  float* c = nullptr;  // fp32 always: a bf16 C is rounded from a kept fp32 copy afterwards
  size_t ldc = 0, outer_c = 0, inner_c = 0;
  size_t outer = 1, inner = 1;
  BatchParts parts;
};

struct BatchedKey {
  size_t o, i, m, n, k;
  size_t lda, oa, ia, ldb, ob, ib, ldc, oc, ic;
  bool ta, tb;
  dt type;
  float alpha, beta;
  auto operator<=>(const BatchedKey&) const = default;
};

// A memory descriptor of `count_o` x `count_i` entries of (rows, cols) matrices: stored
// transposed when `trans` (so rows have stride 1 and columns stride ld). A batch dimension
// read by every entry (stride 0) has size 1, which oneDNN broadcasts; its stride, and that of
// any dimension of size 1, is set to a positive one (oneDNN ignores it).
dnnl::memory::desc batched_md(size_t count_o, size_t count_i, size_t rows, size_t cols, bool trans,
                              size_t ld, size_t so, size_t si, dt type) {
  using dim = dnnl::memory::dim;
  const size_t entry = (trans ? cols : rows) * ld;
  const size_t n_i = si == 0 ? 1 : count_i;
  const size_t n_o = so == 0 ? 1 : count_o;
  const size_t stride_i = n_i == 1 ? entry : si;
  const size_t stride_o = n_o == 1 ? n_i * stride_i : so;
  return dnnl::memory::desc(
      dnnl::memory::dims{static_cast<dim>(n_o), static_cast<dim>(n_i), static_cast<dim>(rows),
                         static_cast<dim>(cols)},
      type,
      dnnl::memory::dims{static_cast<dim>(stride_o), static_cast<dim>(stride_i),
                         static_cast<dim>(trans ? 1 : ld), static_cast<dim>(trans ? ld : 1)});
}

size_t elem_bytes(dt type) { return type == dt::bf16 ? 2 : 4; }

const void* offset(const BatchedOperand& x, size_t o, size_t i) {
  return static_cast<const char*>(x.data) + (o * x.outer + i * x.inner) * elem_bytes(x.type);
}

dnnl_status_t run_batch_part(const BatchedArgs& g, Block ob, Block ib) {
  thread_local std::map<BatchedKey, dnnl::matmul> cache;
  const BatchedKey key{ob.count,  ib.count, g.M,       g.N,       g.K,   g.a.ld,    g.a.outer,
                       g.a.inner, g.b.ld,   g.b.outer, g.b.inner, g.ldc, g.outer_c, g.inner_c,
                       g.ta,      g.tb,     g.a.type,  g.alpha,   g.beta};
  const auto a_md =
      batched_md(ob.count, ib.count, g.M, g.K, g.ta, g.a.ld, g.a.outer, g.a.inner, g.a.type);
  const auto b_md =
      batched_md(ob.count, ib.count, g.K, g.N, g.tb, g.b.ld, g.b.outer, g.b.inner, g.b.type);
  const auto c_md =
      batched_md(ob.count, ib.count, g.M, g.N, false, g.ldc, g.outer_c, g.inner_c, dt::f32);
  try {
    auto it = cache.find(key);
    if (it == cache.end()) {
      if (cache.size() >= 256) cache.clear();
      dnnl::primitive_attr attr;
      if (g.alpha != 1.0f) attr.set_output_scales(0, {g.alpha});
      if (g.beta != 0.0f) {
        dnnl::post_ops ops;
        ops.append_sum(g.beta);
        attr.set_post_ops(ops);
      }
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr,
                                            cpu_engine());
      it = cache.emplace(key, dnnl::matmul(pd)).first;
    }
    thread_local dnnl::stream stream(cpu_engine());
    dnnl::memory am(a_md, cpu_engine(), const_cast<void*>(offset(g.a, ob.begin, ib.begin)));
    dnnl::memory bm(b_md, cpu_engine(), const_cast<void*>(offset(g.b, ob.begin, ib.begin)));
    dnnl::memory cm(c_md, cpu_engine(), g.c + ob.begin * g.outer_c + ib.begin * g.inner_c);
    it->second.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    stream.wait();
  } catch (const dnnl::error& e) {
    return e.status;
  }
  return dnnl_success;
}

struct BatchedJob final : PoolJob {
  const BatchedArgs* args = nullptr;

  void work() override {
    const BatchParts& p = args->parts;
    claim_parts(p.count(), [this, &p](size_t i) {
      return run_batch_part(*args, batch_range(args->outer, p.parts_o, i / p.parts_i),
                            batch_range(args->inner, p.parts_i, i % p.parts_i));
    });
  }
};

// Kept between calls, like gemm()'s copies: packed operands and the fp32 C behind a bf16 one.
thread_local std::vector<BFloat16> t_batched_a16, t_batched_b16;
thread_local std::vector<float> t_batched_a32, t_batched_b32, t_batched_c32;

// Elements from an operand's first entry to the end of its last one, all entries of
// (rows, cols) stored with row stride ld; checks ld and the span's length.
size_t batched_extent(const char* name, size_t length, size_t rows, size_t cols, size_t ld,
                      size_t so, size_t si, const GemmBatch& batch, const char* shape) {
  if (ld < cols) {
    throw InvalidArgument(
        fmt::format("gemm_batched: ld{} = {} is less than the {} columns of {} as stored ({}); "
                    "use ld{} >= {}",
                    name, ld, cols, name, shape, name, cols));
  }
  if (batch.count() == 0 || rows == 0 || cols == 0) return 0;
  size_t need = extent(rows, cols, ld), step = 0;
  if (__builtin_mul_overflow(batch.outer - 1, so, &step) ||
      __builtin_add_overflow(need, step, &need) ||
      __builtin_mul_overflow(batch.inner - 1, si, &step) ||
      __builtin_add_overflow(need, step, &need)) {
    throw InvalidArgument(
        fmt::format("gemm_batched: {} x {} entries of {} with strides ({}, {}) overflow size_t",
                    batch.outer, batch.inner, name, so, si));
  }
  if (length < need) {
    throw InvalidArgument(fmt::format(
        "gemm_batched: {} holds {} elements, but {} x {} entries of ({}, {}) with ld{} = {} at "
        "strides ({}, {}) span {} ({})",
        name, length, batch.outer, batch.inner, rows, cols, name, ld, so, si, need, shape));
  }
  return need;
}

// C's entries are disjoint if, ordered by stride, each dimension steps past everything the
// smaller ones span (a nested layout). Dimensions of one element do not step.
void check_c_disjoint(size_t M, size_t N, size_t ldc, const GemmBatch& batch) {
  struct Dim {
    size_t count, stride;
  };
  if (batch.count() == 0 || M == 0 || N == 0) return;
  Dim dims[] = {{N, 1}, {M, ldc}, {batch.inner, batch.inner_c}, {batch.outer, batch.outer_c}};
  std::sort(std::begin(dims), std::end(dims),
            [](const Dim& x, const Dim& y) { return x.stride < y.stride; });
  size_t spanned = 1;  // elements the smaller dimensions reach past their first, plus one
  for (const Dim& d : dims) {
    if (d.count == 1) continue;
    if (d.stride < spanned) {
      throw InvalidArgument(fmt::format(
          "gemm_batched: c's entries overlap: {} x {} entries of ({}, {}) with ldc = {} at "
          "strides ({}, {}); give each entry its own elements",
          batch.outer, batch.inner, M, N, ldc, batch.outer_c, batch.inner_c));
    }
    spanned += (d.count - 1) * d.stride;
  }
}

// Whether a batch of stored (rows, cols) matrices is dense: rows of exactly cols elements,
// entries back to back (a dimension of stride 0 counts once). oneDNN 2.6's brgemm matmul
// kernels take only dense batches; anything else goes to its gemm-based matmul, which runs
// the entries one by one and is no faster than a gemm() call per entry (bench: 64 heads of
// GPT-small's 64x64x32 scores, fp32 155 us in place with ld = 3C vs 96 us dense, while
// copying q and k dense costs 25 us).
bool is_dense(size_t rows, size_t cols, size_t ld, size_t so, size_t si, const GemmBatch& batch) {
  const size_t n_i = si == 0 ? 1 : batch.inner;
  const size_t n_o = so == 0 ? 1 : batch.outer;
  return ld == cols && (n_i == 1 || si == rows * cols) && (n_o == 1 || so == n_i * rows * cols);
}

// The (outer, inner) entries of a stored (rows, cols) operand copied by
// `copy_row(dst, src, cols)` densely into `out` (one copy along a dimension of stride 0).
template <typename To, typename From, typename CopyRow>
BatchedOperand pack_dense(std::vector<To>& out, const From* x, size_t rows, size_t cols, size_t ld,
                          size_t so, size_t si, const GemmBatch& batch, dt type, CopyRow copy_row) {
  const size_t n_o = so == 0 ? 1 : batch.outer;
  const size_t n_i = si == 0 ? 1 : batch.inner;
  const size_t entry = rows * cols;
  out.resize(n_o * n_i * entry);
  for (size_t o = 0; o < n_o; ++o) {
    for (size_t i = 0; i < n_i; ++i) {
      To* dst = out.data() + (o * n_i + i) * entry;
      const From* src = x + o * so + i * si;
      for (size_t r = 0; r < rows; ++r) copy_row(dst + r * cols, src + r * ld, cols);
    }
  }
  return {.data = out.data(),
          .type = type,
          .ld = cols,
          .outer = n_o == 1 ? 0 : n_i * entry,
          .inner = n_i == 1 ? 0 : entry};
}

void copy_f32(float* d, const float* s, size_t n) { std::copy_n(s, n, d); }
void copy_bf16(BFloat16* d, const BFloat16* s, size_t n) { std::copy_n(s, n, d); }
void round_f32(BFloat16* d, const float* s, size_t n) {
  convert(std::span<const float>(s, n), std::span<BFloat16>(d, n));
}
void widen_bf16(float* d, const BFloat16* s, size_t n) {
  convert(std::span<const BFloat16>(s, n), std::span<float>(d, n));
}
// The fallback's kBF16 on an fp32 operand: its values rounded, widened back.
void round_and_widen(float* d, const float* s, size_t n) {
  thread_local std::vector<BFloat16> row;
  row.resize(n);
  convert(std::span<const float>(s, n), std::span<BFloat16>(row));
  convert(std::span<const BFloat16>(row), std::span<float>(d, n));
}

// One operand as the primitive reads it: bf16 on the oneDNN bf16 path, fp32 otherwise, and
// always dense (read in place when it is so already, else copied densely into own16/own32).
// On the bf16 path an fp32 operand is read from a live Bf16Operands scope's copy when one
// holds it, else rounded; so every route to the same bf16 values gives the same primitive
// and the same bits. `round`: kBF16 on the fallback path.
BatchedOperand normalize(const GemmOperand& x, bool bf16_path, bool round, size_t rows, size_t cols,
                         size_t ld, size_t so, size_t si, size_t span, const GemmBatch& batch,
                         std::vector<BFloat16>& own16, std::vector<float>& own32) {
  so = batch.outer == 1 ? 0 : so;
  si = batch.inner == 1 ? 0 : si;
  const bool dense = is_dense(rows, cols, ld, so, si, batch);
  auto in_place = [&](const void* data, dt type) {
    return BatchedOperand{.data = data, .type = type, .ld = ld, .outer = so, .inner = si};
  };
  if (bf16_path) {
    const BFloat16* x16 = x.is_bf16() ? x.bf16().data() : scoped_bf16(x.f32().data(), span);
    if (x16 != nullptr) {
      return dense ? in_place(x16, dt::bf16)
                   : pack_dense(own16, x16, rows, cols, ld, so, si, batch, dt::bf16, copy_bf16);
    }
    return pack_dense(own16, x.f32().data(), rows, cols, ld, so, si, batch, dt::bf16, round_f32);
  }
  if (x.is_bf16()) {
    return pack_dense(own32, x.bf16().data(), rows, cols, ld, so, si, batch, dt::f32, widen_bf16);
  }
  if (round) {
    return pack_dense(own32, x.f32().data(), rows, cols, ld, so, si, batch, dt::f32,
                      round_and_widen);
  }
  return dense
             ? in_place(x.f32().data(), dt::f32)
             : pack_dense(own32, x.f32().data(), rows, cols, ld, so, si, batch, dt::f32, copy_f32);
}

// gemm_batched's arguments: storage, one c per entry, every operand inside its buffer, no c
// overlapping another c, a or b. Returns the elements a and b span.
std::pair<size_t, size_t> check_batched(GemmCompute compute, bool ta, bool tb, size_t M, size_t N,
                                        size_t K, GemmOperand a, size_t lda, GemmOperand b,
                                        size_t ldb, float beta, GemmResult c, size_t ldc,
                                        const GemmBatch& batch) {
  check_storage("gemm_batched", compute, a, b, c, beta);
  if ((batch.outer > 1 && batch.outer_c == 0) || (batch.inner > 1 && batch.inner_c == 0)) {
    throw InvalidArgument(fmt::format(
        "gemm_batched: c's strides ({}, {}) for {} x {} entries write one matrix for several; "
        "give each entry its own c",
        batch.outer_c, batch.inner_c, batch.outer, batch.inner));
  }
  const size_t a_rows = ta ? K : M, a_cols = ta ? M : K;
  const size_t b_rows = tb ? N : K, b_cols = tb ? K : N;
  const size_t a_span = batched_extent("a", a.size(), a_rows, a_cols, lda, batch.outer_a,
                                       batch.inner_a, batch, ta ? "A^T: K x M" : "M x K");
  const size_t b_span = batched_extent("b", b.size(), b_rows, b_cols, ldb, batch.outer_b,
                                       batch.inner_b, batch, tb ? "B^T: N x K" : "K x N");
  const size_t c_span =
      batched_extent("c", c.size(), M, N, ldc, batch.outer_c, batch.inner_c, batch, "M x N");
  check_c_disjoint(M, N, ldc, batch);
  const Bytes c_bytes = bytes_of(c, c_span);
  if (overlaps(c_bytes, bytes_of(a, a_span)) || overlaps(c_bytes, bytes_of(b, b_span))) {
    throw InvalidArgument(fmt::format(
        "gemm_batched: c overlaps a or b (M={} N={} K={}, {} x {} entries); write the products "
        "to a separate buffer",
        M, N, K, batch.outer, batch.inner));
  }
  return {a_span, b_span};
}

// fp32: one gemm() per entry, in place: measured faster than the batched primitive for fp32
// (gemm.h). gemm_batched records the call once, so the entries' calls are not recorded.
void gemm_each_entry(Transpose trans_a, Transpose trans_b, size_t M, size_t N, size_t K,
                     float alpha, GemmOperand a, size_t lda, GemmOperand b, size_t ldb, float beta,
                     GemmResult c, size_t ldc, const GemmBatch& batch) {
  std::vector<GemmShape>* const recording = t_recording;
  t_recording = nullptr;
  try {
    for (size_t o = 0; o < batch.outer; ++o) {
      for (size_t i = 0; i < batch.inner; ++i) {
        gemm(GemmCompute::kFP32, trans_a, trans_b, M, N, K, alpha,
             a.f32().subspan(o * batch.outer_a + i * batch.inner_a), lda,
             b.f32().subspan(o * batch.outer_b + i * batch.inner_b), ldb, beta,
             c.f32().subspan(o * batch.outer_c + i * batch.inner_c), ldc);
      }
    }
  } catch (...) {
    t_recording = recording;
    throw;
  }
  t_recording = recording;
}

}  // namespace

void gemm_batched(GemmCompute compute, Transpose trans_a, Transpose trans_b, size_t M, size_t N,
                  size_t K, float alpha, GemmOperand a, size_t lda, GemmOperand b, size_t ldb,
                  float beta, GemmResult c, size_t ldc, const GemmBatch& batch) {
  const bool ta = trans_a == Transpose::kYes;
  const bool tb = trans_b == Transpose::kYes;
  const size_t a_rows = ta ? K : M, a_cols = ta ? M : K;
  const size_t b_rows = tb ? N : K, b_cols = tb ? K : N;
  const auto [a_span, b_span] =
      check_batched(compute, ta, tb, M, N, K, a, lda, b, ldb, beta, c, ldc, batch);
  if (batch.count() == 0) return;
  if (t_recording != nullptr) t_recording->push_back({trans_a, trans_b, M, N, K});
  if (M == 0 || N == 0) return;

  if (compute == GemmCompute::kFP32) {
    gemm_each_entry(trans_a, trans_b, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc, batch);
    return;
  }

  // The fp32 C the primitive writes: the caller's when it is fp32 and dense, else a kept
  // dense buffer (holding C's values first when beta reads them), copied or rounded into C
  // afterwards. Every C layout and type thus runs the same primitive: a bf16 C is the fp32
  // one rounded with convert(), bit for bit.
  const size_t so_c = batch.outer == 1 ? 0 : batch.outer_c;
  const size_t si_c = batch.inner == 1 ? 0 : batch.inner_c;
  const bool c_in_place = !c.is_bf16() && is_dense(M, N, ldc, so_c, si_c, batch);
  float* c32 = c.f32().data();
  auto for_each_c_row = [&](auto&& fn) {  // fn(row of C, row of the dense buffer)
    for (size_t o = 0; o < batch.outer; ++o) {
      for (size_t i = 0; i < batch.inner; ++i) {
        const size_t first = o * batch.outer_c + i * batch.inner_c;
        const size_t dense_first = (o * batch.inner + i) * M * N;
        for (size_t r = 0; r < M; ++r) fn(first + r * ldc, dense_first + r * N);
      }
    }
  };
  if (!c_in_place) {
    t_batched_c32.resize(batch.count() * M * N);
    c32 = t_batched_c32.data();
    if (beta != 0.0f) {
      for_each_c_row(
          [&](size_t row, size_t dense) { std::copy_n(c.f32().data() + row, N, c32 + dense); });
    }
  }
  auto write_c = [&] {
    if (c_in_place) return;
    for_each_c_row([&](size_t row, size_t dense) {
      if (c.is_bf16()) {
        convert(std::span<const float>(c32 + dense, N), c.bf16().subspan(row, N));
      } else {
        std::copy_n(c32 + dense, N, c.f32().data() + row);
      }
    });
  };

  // BLAS semantics, as gemm(): C = beta * C without reading A or B.
  if (K == 0 || alpha == 0.0f) {
    float* x = c32;
    const size_t n = batch.count() * M * N;
    if (beta == 0.0f) {
      std::fill(x, x + n, 0.0f);
    } else if (beta != 1.0f) {
      for (size_t j = 0; j < n; ++j) x[j] *= beta;
    }
    write_c();
    return;
  }

  const bool bf16 = compute == GemmCompute::kBF16;
  const bool bf16_path = bf16 && cpu_has_bf16();
  BatchedArgs args{.ta = ta,
                   .tb = tb,
                   .M = M,
                   .N = N,
                   .K = K,
                   .alpha = alpha,
                   .beta = beta,
                   .a = normalize(a, bf16_path, bf16, a_rows, a_cols, lda, batch.outer_a,
                                  batch.inner_a, a_span, batch, t_batched_a16, t_batched_a32),
                   .b = normalize(b, bf16_path, bf16, b_rows, b_cols, ldb, batch.outer_b,
                                  batch.inner_b, b_span, batch, t_batched_b16, t_batched_b32),
                   .c = c32,
                   .ldc = N,
                   .outer_c = batch.outer == 1 ? 0 : batch.inner * M * N,
                   .inner_c = batch.inner == 1 ? 0 : M * N,
                   .outer = batch.outer,
                   .inner = batch.inner,
                   .parts = batch_parts_for(M, N, K, batch.outer, batch.inner)};
  BatchedJob job;
  job.args = &args;
  SingleThreadedOneDnn single;
  run_parts(job, args.parts.count());
  const auto status = static_cast<dnnl_status_t>(job.status.load());
  if (status != dnnl_success) {
    throw Error(fmt::format(
        "gemm_batched: oneDNN's matmul failed with status {} for M={} N={} K={}, {} x {} entries",
        static_cast<int>(status), M, N, K, batch.outer, batch.inner));
  }
  write_c();
}

size_t gemm_batched_part_count(size_t M, size_t N, size_t K, const GemmBatch& batch) {
  return batch_parts_for(M, N, K, batch.outer, batch.inner).count();
}

namespace {
size_t gemm_batched_copy_bytes() {
  return (t_batched_a16.capacity() + t_batched_b16.capacity()) * sizeof(BFloat16) +
         (t_batched_a32.capacity() + t_batched_b32.capacity() + t_batched_c32.capacity()) *
             sizeof(float);
}
}  // namespace

}  // namespace zerodp
