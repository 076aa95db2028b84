// Models as ordered lists of units (the FSDP idea): embedding, each transformer block,
// final norm + head. A unit owns one flat parameter buffer; its tensors are views at fixed
// offsets into it, so a rank's shard of a unit is a slice, and the engine can point a unit
// at resident weights or at a freshly gathered copy without the unit knowing.
//
// Units compute in fp32 on an fp32 view of their flat buffer (the engine widens 16-bit
// weights into a workspace) and never communicate. What their matrix products multiply in
// (GemmCompute, tensor/gemm.h) is not theirs to decide: it comes with the weights
// (UnitWeights), chosen by the caller (the engine: once per run, from --precision), and a
// unit passes it to every layer that multiplies.
//
// Unit::forward/backward are the one entry: they check the buffer-length contract below
// for every unit, open the Bf16Operands scope that makes bf16 products read the stored bf16
// weights, and only then call the unit's do_forward/do_backward. Units implement those and
// check only what the contract does not cover (their own limits on the batch shape, inputs
// outside the activations such as mb.features).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/gemm.h"

namespace zerodp {

enum class InitKind : uint8_t { kNormal, kZeros, kOnes };

// How a unit reads a tensor's values. kProductOperand: only as an operand of gemm() matrix
// products (a Linear's weight), never elementwise or by row. Under bf16 products the engine
// then does not widen the tensor to fp32: the products read its stored bf16 copy
// (UnitWeights::stored_bf16, through the Bf16Operands scope Unit::forward/backward open),
// and its fp32 view holds stale values. A claim the unit makes about its own code, checked
// by model_testing's NaN test for every built-in model.
enum class TensorUse : uint8_t { kAny, kProductOperand };

// One parameter tensor inside a unit's flat buffer.
struct TensorSpec {
  std::string name;            // canonical, e.g. "h.0.attn.c_attn.weight" (PyTorch's names)
  std::vector<int64_t> shape;  // row-major, as PyTorch lays it out: Linear weight is (out, in)
  size_t offset = 0;           // first element within the unit's flat buffer
  size_t numel = 0;
  InitKind init = InitKind::kNormal;
  float init_std = 0.02f;    // for kNormal
  bool weight_decay = true;  // norms and biases: false (policy as data, not indices)
  TensorUse use = TensorUse::kAny;
};

// The shape of one micro-batch as a unit sees it.
struct BatchShape {
  int B = 0;  // sequences (or images) in the micro-batch
  int T = 1;  // tokens per sequence (1 for images)
};

// Inputs that are not activations: tokens and targets for language models, images and
// labels for classifiers. Spans unused by a model are empty.
struct MicroBatch {
  BatchShape shape;
  std::span<const int32_t> tokens;   // (B, T)
  std::span<const int32_t> targets;  // (B, T) for LM, (B) labels for classifiers
  std::span<const float> features;   // (B, F) for classifiers
  // d(loss)/d(unit loss) the head seeds backward with: 1/A for A accumulated micro-batches,
  // times the fp16 loss scale.
  float loss_grad_scale = 1.0f;
};

// The weights a unit computes with, and what its products multiply in.
struct UnitWeights {
  std::span<const float> values;  // (numel) the unit's flat buffer in fp32
  // (numel) the bf16 buffer `values` was widened from (a bf16 run's stored weights), or
  // empty. When given with kBF16, products read their weight operands from it, so `values`
  // may hold stale values in kProductOperand tensors (see TensorUse).
  std::span<const BFloat16> stored_bf16;
  GemmCompute compute = GemmCompute::kFP32;  // what every product of the unit multiplies in

  // fp32 values, fp32 products, no stored copy: reference passes, sampling, tests.
  static UnitWeights fp32(std::span<const float> values) {
    return {.values = values, .stored_bf16 = {}, .compute = GemmCompute::kFP32};
  }
};

class Unit {
 public:
  virtual ~Unit() = default;
  Unit(const Unit&) = delete;
  Unit& operator=(const Unit&) = delete;

  const std::string& name() const { return name_; }
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  size_t numel() const { return numel_; }

  // Elements of the activation this unit reads (0 for the first unit, whose input is the
  // micro-batch) and writes (the head writes one: the mean loss).
  virtual size_t input_count(const BatchShape& s) const = 0;
  virtual size_t output_count(const BatchShape& s) const = 0;
  // Floats forward() saves for backward() when its products multiply in `compute`. Under
  // kBF16 a unit may keep what feeds only products in bf16, two values per float of the
  // buffer (the bf16 pipeline: rounded once, by the layer that produces it), so the count
  // depends on it; the engine and the planner ask with the run's compute.
  virtual size_t saved_count(const BatchShape& s, GemmCompute compute) const = 0;
  // Floats of scratch forward() or backward() may use, not kept between them.
  virtual size_t scratch_count(const BatchShape& s) const = 0;
  // The matrix products forward() and backward() call for a micro-batch of shape `s` (any
  // order, repeats allowed): the shapes a run times for its model-shape GEMM peak
  // (train/setup.h). Empty, the default, means undeclared: a caller's own units need not
  // say, and their run reports no such peak. The built-in models declare theirs, and a test
  // compares the declaration with what gemm() is called with.
  virtual std::vector<GemmShape> products(const BatchShape& s) const {
    (void)s;
    return {};
  }
  // The contract, checked here for every unit before its hook runs: w.values and dw hold
  // numel(), w.stored_bf16 numel() or nothing; in, din input_count; out, dout output_count
  // (dout may be empty for a unit whose output is the loss, output_count 1: the head starts
  // from mb.loss_grad_scale); saved exactly saved_count; scratch at least scratch_count (one
  // workspace sized for the largest unit may be passed to all). Anything else throws
  // InvalidArgument naming the unit, the function, the buffer, its length and what the
  // shape needs. Both open a Bf16Operands scope over w.values with w.stored_bf16 for the
  // call, so callers cannot forget it.

  // out = f(w, in); fills `saved` for backward. `scratch` is free to overwrite.
  void forward(const UnitWeights& w, std::span<const float> in, std::span<float> out,
               std::span<float> saved, std::span<float> scratch, const MicroBatch& mb);
  // Adds (+=) d(loss)/dw into `dw` and d(loss)/din into `din` (which the caller zeroes);
  // `dout` is d(loss)/dout (unused by the head, which starts from mb.loss_grad_scale).
  void backward(const UnitWeights& w, std::span<const float> in, std::span<const float> saved,
                std::span<const float> dout, std::span<float> dw, std::span<float> din,
                std::span<float> scratch, const MicroBatch& mb);

 protected:
  // The unit's computation, called by forward/backward once the lengths are checked; `w` is
  // UnitWeights::values, and every product multiplies in `compute`.
  virtual void do_forward(std::span<const float> w, GemmCompute compute, std::span<const float> in,
                          std::span<float> out, std::span<float> saved, std::span<float> scratch,
                          const MicroBatch& mb) = 0;
  virtual void do_backward(std::span<const float> w, GemmCompute compute, std::span<const float> in,
                           std::span<const float> saved, std::span<const float> dout,
                           std::span<float> dw, std::span<float> din, std::span<float> scratch,
                           const MicroBatch& mb) = 0;

  // Throw InvalidArgument unless a buffer of `length` elements holds exactly (check_exact)
  // or at least (check_at_least) `expected`, in the contract's wording: "unit h.0 forward:
  // saved holds 10 elements; (B=2, T=5) needs 12". For what the contract does not cover.
  void check_exact(std::string_view fn, std::string_view what, size_t length, size_t expected,
                   const BatchShape& s) const;
  void check_at_least(std::string_view fn, std::string_view what, size_t length, size_t expected,
                      const BatchShape& s) const;

  explicit Unit(std::string name) : name_(std::move(name)) {}
  // Appends a tensor at the end of the flat buffer.
  void add_tensor(std::string name, std::vector<int64_t> shape, InitKind init, float init_std,
                  bool weight_decay, TensorUse use = TensorUse::kAny);

 private:
  std::string name_;
  std::vector<TensorSpec> tensors_;
  size_t numel_ = 0;
};

using Model = std::vector<std::unique_ptr<Unit>>;

}  // namespace zerodp
