// Models as ordered lists of units (the FSDP idea): embedding, each transformer block,
// final norm + head. A unit owns one flat parameter buffer; its tensors are views at fixed
// offsets into it, so a rank's shard of a unit is a slice, and the engine can point a unit
// at resident weights or at a freshly gathered copy without the unit knowing.
//
// Units compute in fp32 on an fp32 view of their flat buffer (the engine widens 16-bit
// weights into a workspace) and never communicate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace zerodp {

enum class InitKind : uint8_t { kNormal, kZeros, kOnes };

// How a unit reads a tensor's values. kProductOperand: only as an operand of gemm() matrix
// products (a Linear's weight), never elementwise or by row. Under bf16 products the engine
// then does not widen the tensor to fp32: the products read its stored bf16 copy through a
// Bf16Operands scope (tensor/gemm.h), and its fp32 view holds stale values. A claim the unit
// makes about its own code, checked by model_testing's NaN test for every built-in model.
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
  // Floats forward() saves for backward().
  virtual size_t saved_count(const BatchShape& s) const = 0;
  // Floats of scratch forward() or backward() may use, not kept between them.
  virtual size_t scratch_count(const BatchShape& s) const = 0;
  // Buffer lengths: w, dw hold numel(); in, din input_count; out, dout output_count (dout
  // may be empty for the head); saved exactly saved_count; scratch at least scratch_count
  // (one workspace sized for the largest unit may be passed to all). Anything else throws
  // InvalidArgument naming the unit and the buffer.

  // out = f(w, in); fills `saved` for backward. `scratch` is free to overwrite.
  virtual void forward(std::span<const float> w, std::span<const float> in, std::span<float> out,
                       std::span<float> saved, std::span<float> scratch, const MicroBatch& mb) = 0;
  // Adds (+=) d(loss)/dw into `dw` and d(loss)/din into `din` (which the caller zeroes);
  // `dout` is d(loss)/dout (unused by the head, which starts from mb.loss_grad_scale).
  virtual void backward(std::span<const float> w, std::span<const float> in,
                        std::span<const float> saved, std::span<const float> dout,
                        std::span<float> dw, std::span<float> din, std::span<float> scratch,
                        const MicroBatch& mb) = 0;

 protected:
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
