// gemm: the one matrix product every layer uses, backed by oneDNN (fp32 C; operands fp32 or
// rounded to bf16, as the caller says).
//
//   C = alpha * op(A) * op(B) + beta * C        row-major; op(X) = X or X^T
//
// op(A) is (M, K), op(B) is (K, N), C is (M, N). Leading dimensions are row strides in
// elements, so a head's slice of a (B, T, 3*C) qkv buffer is a matrix with ld = 3*C.
// BLAS conventions: beta == 0 means C is only written (NaN or garbage in C is ignored);
// K == 0 or alpha == 0 means C = beta * C without reading A or B.
//
// Determinism (zerodp's contract: no result depends on the thread count or on buffer
// addresses). dnnl_sgemm's own OpenMP threading does not give that: with more threads it
// may split K across threads and sum the partial products (measured on oneDNN 2.6.3: 82 of
// 388 random shapes change bits between 1 and 2..16 threads, e.g. NT 1024x512x1024 and most
// M == 1 or N == 1 products, which go to a threaded gemv, already at 2 threads). So gemm()
// never lets oneDNN thread: it cuts C into tiles that are a pure function of (M, N, K),
// never splitting K, and runs each tile as a single-threaded dnnl_sgemm. The threads of
// this calling thread's pool (set_gemm_threads) take tiles in any order; each element of C
// is computed by exactly one tile call, so the bits are the same for 1 or 16 threads, and
// tests check it. Addresses: oneDNN packs its operands, and tests check that shifting every
// buffer by a few floats gives the same bits.
//
// What is NOT promised: a row of C computed as part of a product with M rows may differ in
// the last bits from the same row computed by a product with fewer rows (the tiles and
// oneDNN's internal K blocking depend on the shape). Products of equal shapes agree.
//
// Thread safety: gemm() may be called from any number of threads at once; each calling
// thread uses its own pool (see set_gemm_threads).
#pragma once

#include <compare>
#include <concepts>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "tensor/dtype.h"

namespace zerodp {

enum class Transpose : bool { kNo = false, kYes = true };

// What a product multiplies in, chosen by its caller and passed to every gemm() call: no
// thread or global state decides it. Training decides once per run (the engine's
// compute_for(precision): kBF16 for --precision bf16, the way PyTorch's CPU autocast runs
// matmuls) and hands it to each unit with its weights (models/unit.h's UnitWeights); the
// layers pass it on to their products.
//   kFP32  fp32 operands, fp32 products;
//   kBF16  both operands rounded to bf16 (to nearest even) once per call, products summed in
//          fp32, C fp32 with alpha and beta as above. On CPUs with AVX-512 BF16 through oneDNN's
//          matmul primitive (~1.8-2x the fp32 rate here, rounding included); elsewhere, or with
//          ZERODP_GEMM_BF16=fallback in the environment, the rounded operands go through the
//          fp32 path. Both agree with the exact product of the rounded operands to fp32
//          accumulation error, not bit for bit with each other; each is deterministic under
//          the contract above (same tiles, no split K).
enum class GemmCompute { kFP32, kBF16 };

// A matrix as gemm() reads it: fp32 values, or values stored in bf16. A bf16 pipeline keeps
// the activations that only feed products (LayerNorm and GELU outputs, qkv, attention's
// output) in bf16, produced rounded by the layer before, so no product rounds them again and
// they take half the memory. Converts implicitly from anything that converts to a span of
// either, so callers pass what they hold. A bf16 operand needs kBF16 compute.
class GemmOperand {
 public:
  GemmOperand() = default;  // no values (fp32)
  template <typename R>
  requires std::convertible_to<R&&, std::span<const float>> GemmOperand(
      R&& values)  // NOLINT(google-explicit-constructor): an operand is its values
      : f32_(std::span<const float>(std::forward<R>(values))) {}
  template <typename R>
  requires std::convertible_to<R&&, std::span<const BFloat16>> GemmOperand(
      R&& values)  // NOLINT(google-explicit-constructor)
      : bf16_(std::span<const BFloat16>(std::forward<R>(values))), is_bf16_(true) {}

  bool is_bf16() const { return is_bf16_; }
  size_t size() const { return is_bf16_ ? bf16_.size() : f32_.size(); }
  std::span<const float> f32() const { return f32_; }
  std::span<const BFloat16> bf16() const { return bf16_; }

 private:
  std::span<const float> f32_;
  std::span<const BFloat16> bf16_;
  bool is_bf16_ = false;
};

// Where gemm() writes C: fp32, or bf16 (each element the fp32 result rounded to nearest even,
// exactly as convert() rounds it; only with kBF16 compute and beta == 0, since a bf16 C is
// never read back). The layers that write a product's input (LayerNorm, GELU) take the same
// type for their output.
class GemmResult {
 public:
  GemmResult() = default;  // no values (fp32)
  template <typename R>
  requires std::convertible_to<R&&, std::span<float>> GemmResult(
      R&& values)  // NOLINT(google-explicit-constructor)
      : f32_(std::span<float>(std::forward<R>(values))) {}
  template <typename R>
  requires std::convertible_to<R&&, std::span<BFloat16>> GemmResult(
      R&& values)  // NOLINT(google-explicit-constructor)
      : bf16_(std::span<BFloat16>(std::forward<R>(values))), is_bf16_(true) {}

  bool is_bf16() const { return is_bf16_; }
  size_t size() const { return is_bf16_ ? bf16_.size() : f32_.size(); }
  std::span<float> f32() const { return f32_; }
  std::span<BFloat16> bf16() const { return bf16_; }

 private:
  std::span<float> f32_;
  std::span<BFloat16> bf16_;
  bool is_bf16_ = false;
};

// C = alpha * op(A) * op(B) + beta * C (see above), multiplied in `compute`. Spans must
// cover every element the product reads or writes: op(A) untransposed is M rows of stride lda
// (lda >= K), transposed it is stored as K rows of stride lda (lda >= M); likewise B; C is M
// rows of stride ldc (ldc >= N). C must not overlap A or B. Throws InvalidArgument naming the
// operand, its length and what the shape needs.
//
// bias, when not empty, holds N values added to every row: C = alpha * op(A) * op(B) + bias
// (beta must be 0). Each tile starts its rows at the bias (fp32), or the matmul primitive
// adds it (bf16 with alpha = 1), instead of a pass over all of C before the product:
// a Linear's forward costs 14-23 % more with a separate bias pass on GPT-medium shapes in
// bf16 (measured before this argument existed).
//
// A or B may be stored in bf16 and C written in bf16 (GemmOperand, GemmResult): the product is
// then what it would be with the same values in fp32 operands, and C the fp32 result rounded.
void gemm(GemmCompute compute, Transpose trans_a, Transpose trans_b, size_t M, size_t N, size_t K,
          float alpha, GemmOperand a, size_t lda, GemmOperand b, size_t ldb, float beta,
          GemmResult c, size_t ldc, std::span<const float> bias = {});

// How many threads gemm() calls made from the calling thread use, the caller included;
// 1 (the default) runs every tile on the calling thread. A per-thread setting, like
// omp_set_num_threads: each data-parallel rank thread sets its own. Use
// max(1, cores / ranks): rank threads that each ask for all cores oversubscribe them, and
// with 2 ranks on 2 cores one thread each is as fast as two (bench_gemm, "ranks" rows).
// The helpers (threads - 1 std::threads) start on the first call that needs them, block
// (never spin) between calls, and stop when the calling thread exits or sets 1. oneDNN's own
// OpenMP threads are never used, so OMP_NUM_THREADS, OMP_WAIT_POLICY and GOMP_SPINCOUNT do
// not affect gemm(); it sets the calling thread's OpenMP thread count to 1 for the duration
// of each call and restores it. Results do not depend on this setting. Throws
// InvalidArgument unless 1 <= threads <= 256.
void set_gemm_threads(int threads);
int gemm_threads();

// Whether kBF16 products run on oneDNN's bf16 path (AVX-512 BF16, not disabled by
// ZERODP_GEMM_BF16=fallback) rather than the fp32 fallback.
bool gemm_bf16_native();

// Bytes the calling thread keeps for kBF16 products between calls: operands a product rounds
// itself, the scopes' rounded copies below, on the fallback path their fp32 widenings, the
// fp32 tiles behind a bf16 C, and gemm_batched's dense and rounded copies.
// They are kept (a step allocates nothing after its first) and live outside any memory
// ledger, which is why a training report lists them beside it.
size_t gemm_bf16_copy_bytes();

// Rounding every operand at every kBF16 product costs as much as a tenth of a bf16 step:
// a weight is rounded in forward and again in backward, a gradient twice in backward (for
// dX and dW), attention's keys at every query block. A Bf16Operands scope is a rounding
// cache, not a decision: while one lives on the calling thread, kBF16 products (on the
// oneDNN path) read any operand that lies inside its fp32 buffer from one bf16 copy of that
// buffer: `rounded` when given (it must hold exactly the buffer's values rounded, as a 16-bit
// unit's stored weights do for the fp32 copy widened from them), else a copy made when a
// product first reads the buffer. The same rounding either way, so the bits of every product
// are unchanged; the buffer must not change while the scope lives. kFP32 products never
// consult a scope. Scopes nest (the innermost containing one wins) and close in reverse order
// of opening, as local variables do; at most kMaxBf16Operands live at once per thread (more
// throws InvalidArgument). A scope opened with `compute` kFP32 does nothing and costs
// nothing, so callers open one with the compute they pass to the products it serves.
// Unit::forward/backward open the one over a unit's weights (models/unit.h); the layers open
// their own over the activations they multiply more than once.
inline constexpr int kMaxBf16Operands = 8;
class Bf16Operands {
 public:
  Bf16Operands(GemmCompute compute, std::span<const float> values,
               std::span<const BFloat16> rounded = {});
  ~Bf16Operands();
  Bf16Operands(const Bf16Operands&) = delete;
  Bf16Operands& operator=(const Bf16Operands&) = delete;

 private:
  bool active_ = false;
};

// The shape of one gemm() call: what a product costs and how fast it runs depend on these
// alone (not on alpha, beta, the strides or the bias). Models declare the shapes their
// forward and backward call (Unit::products, models/unit.h), so a run can time its own.
struct GemmShape {
  Transpose trans_a = Transpose::kNo;
  Transpose trans_b = Transpose::kNo;
  size_t M = 0, N = 0, K = 0;
  double flops() const {
    return 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  }
  auto operator<=>(const GemmShape&) const = default;
};

// The distinct shapes of `shapes`, sorted.
std::vector<GemmShape> distinct_shapes(std::vector<GemmShape> shapes);

// For tests: while a GemmRecording lives on the calling thread, every gemm() call made from
// that thread appends its shape (after its arguments are checked, before K == 0 or
// alpha == 0 shortcuts). Off by default: without one, gemm() reads one thread-local pointer.
// Recordings nest; the innermost one records.
class GemmRecording {
 public:
  GemmRecording();
  ~GemmRecording();
  GemmRecording(const GemmRecording&) = delete;
  GemmRecording& operator=(const GemmRecording&) = delete;
  const std::vector<GemmShape>& shapes() const { return shapes_; }

 private:
  std::vector<GemmShape> shapes_;
  std::vector<GemmShape>* outer_ = nullptr;
};

// The number of tiles gemm() cuts an (M, N, K) product into: the most threads it can use.
// Exposed for tests and benchmarks.
size_t gemm_tile_count(size_t M, size_t N, size_t K);

// Batched products: many independent products of one shape in one call, for attention's
// (batch, head) pairs, whose products are too small (64x64x32 at GPT-small) for a gemm()
// call each: per call, oneDNN's setup and packing cost about as much as the product.
//
//   C_e = alpha * op(A_e) * op(B_e) + beta * C_e      for every entry e = (i, j), i < outer,
//                                                     j < inner
//
// Entry (i, j) of X starts i * outer_x + j * inner_x elements after X's first element, and is
// a matrix stored as gemm() stores it (row stride ldx, op as trans_x). Two batch dimensions
// describe a head of a sequence inside a (B, T, 3*C) buffer without copies: outer = B with
// stride T*3*C, inner = NH with stride hs. A stride of 0 (with a count above 1) reads one
// matrix for every entry along that dimension; C's strides may not be 0 there.
struct GemmBatch {
  size_t outer = 1, inner = 1;                   // entries: outer x inner
  size_t outer_a = 0, outer_b = 0, outer_c = 0;  // elements between consecutive outer entries
  size_t inner_a = 0, inner_b = 0, inner_c = 0;  // elements between consecutive inner entries
  size_t count() const { return outer * inner; }
};

// The batched product above, multiplied in `compute`:
//   kFP32  every operand and C fp32 (a bf16 one is an InvalidArgument);
//   kBF16  bf16 operands as given; fp32 ones rounded to bf16 (to nearest even, as convert()
//          does) once per call, or read from a live Bf16Operands scope that holds the
//          operand's whole extent; products summed in fp32. Every route to the same bf16
//          values gives the same bits (fp32 values == their rounding given as bf16).
// A bf16 C is the fp32 C rounded with convert(), bit for bit (never oneDNN's own conversion,
// which flushes subnormals).
//
// kFP32 runs one gemm() per entry (so each entry has gemm()'s bits): oneDNN 2.6's batched
// fp32 primitive, copies included, was slower than that (bench_layers, attention rows: GPT-small
// backward 1.04-1.09 ms against 0.93-0.96, medium 3.9-4.0 ms against 2.7-3.2), while for bf16
// it is faster than a gemm() per entry (small backward 1.01-1.05 ms against 1.42-1.51).
//
// How (kBF16): one oneDNN matmul primitive per part of the batch, created once per shape on each
// thread and kept. oneDNN 2.6's fast (brgemm) kernels read only dense batches (rows of exactly
// their columns, entries back to back), so an operand or C laid out otherwise, like a head
// inside qkv, is copied densely first (and C back after), into buffers the calling thread
// keeps; a dense fp32 operand or C is used in place. Without AVX-512 BF16 (or with
// ZERODP_GEMM_BF16=fallback) kBF16 widens the (rounded) operands to fp32 copies and runs the
// fp32 primitive.
//
// Determinism, as gemm(): the batch is cut into parts of whole entries (never a product, never
// K) as a pure function of the shape and the batch, the calling thread's pool
// (set_gemm_threads) runs the parts in any order, each entry is computed by exactly one part,
// so the bits do not depend on the thread count or on addresses. Entries of equal shape in a
// call of equal shape agree; an entry does NOT promise gemm()'s bits for the same product
// (another kernel), only the same product to fp32 accumulation error.
//
// Checked as gemm() is: each span must cover every element its entries read or write,
// C's extent must not overlap A's or B's, and C's entries must not overlap one another (tested
// as a nested layout: ordered by stride, each of C's dimensions - columns, rows, inner, outer -
// steps past everything the smaller ones span; attention's layouts are nested). Throws
// InvalidArgument naming the operand, its length and what the batch needs.
//
// A live GemmRecording records one shape per call with entries: the shape of one entry.
void gemm_batched(GemmCompute compute, Transpose trans_a, Transpose trans_b, size_t M, size_t N,
                  size_t K, float alpha, GemmOperand a, size_t lda, GemmOperand b, size_t ldb,
                  float beta, GemmResult c, size_t ldc, const GemmBatch& batch);

// The number of parts gemm_batched cuts a batch into: the most threads it can use. For tests.
size_t gemm_batched_part_count(size_t M, size_t N, size_t K, const GemmBatch& batch);

}  // namespace zerodp
