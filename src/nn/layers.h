// Layers with explicit forward and backward passes, in the manner of llm.c's train_gpt2.c.
//
// Every layer is a pair of free functions over fp32 spans; the shape of each buffer is
// written beside it. B = batch, T = time, C = channels, OC = output channels, V = vocabulary;
// "rows" is B * T for layers that treat each position alike. Parameters and gradients are
// views into a unit's flat buffers; layers allocate nothing large and never communicate.
//
// Conventions, the same for every layer:
// - forward writes (=) its outputs; backward ADDS (+=) into its d-outputs (dinp, dweight,
//   dbias, ...). Callers zero gradient buffers before the first micro-batch, so weight
//   gradients accumulate over micro-batches and residual streams sum their branches.
//   Linear and GELU can instead overwrite (=) their input gradient, InputGrad::kOverwrite,
//   for a caller that would otherwise zero a buffer only to add into it once.
// - Outputs and d-outputs never overlap the inputs or each other (the kernels' loops are
//   written for distinct buffers, __restrict, so that they vectorize).
// - Every span must hold exactly the elements its shape needs; a mismatch throws
//   InvalidArgument naming the function, the buffer, its length and the shape.
// - Results depend only on the inputs and the shape, never on thread counts or buffer
//   addresses: loops run in a fixed order (no OpenMP here; rank threads give the
//   parallelism), sums are plain loops the compiler may not reassociate (no -ffast-math,
//   -ffp-contract=off), and matrix products go through tensor/gemm.h, which promises the
//   same.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tensor/gemm.h"

namespace zerodp {

// What a backward does with its input gradient (dinp): add into it, the convention, or
// write it, which saves zeroing the buffer first (a pass over it) and lets the product
// write instead of reading and writing.
enum class InputGrad : bool { kAdd = false, kOverwrite = true };

// ---- Linear: out = inp @ weight^T + bias (PyTorch nn.Linear layout) ----
// The products multiply in `compute` (tensor/gemm.h), the caller's choice: a unit passes the
// one it was given with its weights. Under kBF16 the input may be stored in bf16 (the bf16
// pipeline: what feeds only products is kept rounded) and the output written in bf16 (each
// value the fp32 result rounded), with the same products as fp32 buffers of those values.

void linear_forward(GemmResult out,                 // (rows, OC) fp32, or bf16 under kBF16
                    GemmOperand inp,                // (rows, C) fp32, or bf16 under kBF16
                    std::span<const float> weight,  // (OC, C)
                    std::span<const float> bias,    // (OC), or empty for no bias
                    size_t rows, size_t C, size_t OC, GemmCompute compute);

// dinp may be empty when the input needs no gradient (data), dbias must be empty exactly
// when the layer has no bias.
//
// dout may be stored in bf16 (kBF16 only) when whoever rounded it also summed the bias
// gradient from its fp32 values (gelu_backward_bf16): then dbias must be empty.
void linear_backward(std::span<float> dinp,          // (rows, C) += (or = ), or empty
                     std::span<float> dweight,       // (OC, C) +=
                     std::span<float> dbias,         // (OC) +=, or empty
                     GemmOperand dout,               // (rows, OC)
                     GemmOperand inp,                // (rows, C) as given to forward
                     std::span<const float> weight,  // (OC, C)
                     size_t rows, size_t C, size_t OC, GemmCompute compute,
                     InputGrad dinp_mode = InputGrad::kAdd);

// The products the two calls above make for these sizes, forward's then backward's (the
// input-gradient product only when `input_grad`): what a unit declares in Unit::products.
std::vector<GemmShape> linear_products(size_t rows, size_t C, size_t OC, bool input_grad);

// ---- Encoder: token embedding + learned position embedding ----
// out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :]. Tokens outside [0, V) throw
// InvalidArgument naming the position and the value. T may be less than the table's
// length: only wpe's first T rows are used.

void encoder_forward(std::span<float> out,             // (B, T, C)
                     std::span<const int32_t> tokens,  // (B, T)
                     std::span<const float> wte,       // (V, C)
                     std::span<const float> wpe,       // (maxT, C), maxT >= T
                     size_t B, size_t T, size_t C, size_t V);

void encoder_backward(std::span<float> dwte,            // (V, C) +=
                      std::span<float> dwpe,            // (maxT, C) +=, first T rows touched
                      std::span<const float> dout,      // (B, T, C)
                      std::span<const int32_t> tokens,  // (B, T)
                      size_t B, size_t T, size_t C, size_t V);

// ---- LayerNorm over the last dimension, eps 1e-5 (PyTorch's default) ----
// Saves each row's mean and 1/std for backward.

inline constexpr float kLayerNormEps = 1e-5f;

// `out` is fp32, or bf16 (each value rounded as convert() rounds) for products under kBF16:
// the same GemmResult a product writes.
void layernorm_forward(GemmResult out,                 // (rows, C)
                       std::span<float> mean,          // (rows) saved for backward
                       std::span<float> rstd,          // (rows) saved for backward
                       std::span<const float> inp,     // (rows, C)
                       std::span<const float> weight,  // (C)
                       std::span<const float> bias,    // (C)
                       size_t rows, size_t C);

void layernorm_backward(std::span<float> dinp,          // (rows, C) +=
                        std::span<float> dweight,       // (C) +=
                        std::span<float> dbias,         // (C) +=
                        std::span<const float> dout,    // (rows, C)
                        std::span<const float> inp,     // (rows, C)
                        std::span<const float> weight,  // (C)
                        std::span<const float> mean,    // (rows) from forward
                        std::span<const float> rstd,    // (rows) from forward
                        size_t rows, size_t C);

// ---- GELU, exact: 0.5 x (1 + erf(x / sqrt 2)), PyTorch nn.GELU()'s default ----
// (not the tanh approximation GPT-2 was trained with: the exact form is what the peer computes)

// `out` is fp32, or bf16 (each value rounded as convert() rounds) for products under kBF16.
void gelu_forward(GemmResult out,               // (count)
                  std::span<const float> inp);  // (count)

void gelu_backward(std::span<float> dinp,        // (count) += (or =)
                   std::span<const float> inp,   // (count)
                   std::span<const float> dout,  // (count)
                   InputGrad dinp_mode = InputGrad::kAdd);

// For a GELU whose output fed a Linear with a bias, under bf16 products: dinp (rows, width) =
// gelu'(inp) * dout as gelu_backward writes it, rounded to bf16 (as convert() rounds) for the
// products that read it, and dbias (width) += the fp32 dinp summed over rows in row order:
// the Linear's bias gradient, with the bits linear_backward's own sum would give, so that
// linear_backward can take the bf16 dinp with no bias of its own. One pass instead of an
// fp32 write, a rounding pass and a bias pass over the largest gradient of a GPT block.
void gelu_backward_bf16(std::span<BFloat16> dinp,     // (rows, width) =
                        std::span<float> dbias,       // (width) +=
                        std::span<const float> inp,   // (rows, width)
                        std::span<const float> dout,  // (rows, width)
                        size_t rows, size_t width);

// ---- Residual: out = inp1 + inp2 ----

void residual_forward(std::span<float> out,          // (count)
                      std::span<const float> inp1,   // (count)
                      std::span<const float> inp2);  // (count)

void residual_backward(std::span<float> dinp1,        // (count) +=
                       std::span<float> dinp2,        // (count) +=
                       std::span<const float> dout);  // (count)

// ---- Softmax cross-entropy over a vocabulary, mean over the counted targets ----
// Rows whose target is kIgnoreTarget are left out of the loss and of its mean (PyTorch's
// ignore_index); other targets outside [0, V) throw InvalidArgument. Returns the mean loss,
// 0 when every target is ignored. Forward and backward are one pass (the probabilities are
// not kept): unless dlogits is empty, it ADDS dloss * d(mean loss) / d(logits), i.e.
// dloss * (softmax - onehot(target)) / counted for counted rows and nothing for ignored
// ones. dloss carries a loss scale or a 1/accumulation factor.

inline constexpr int32_t kIgnoreTarget = -1;

float cross_entropy_forward_backward(std::span<float> dlogits,          // (rows, V) +=, or empty
                                     std::span<const float> logits,     // (rows, V)
                                     std::span<const int32_t> targets,  // (rows)
                                     size_t rows, size_t V, float dloss = 1.0f);

// ---- The Llama family's layers (docs/architecture.md, "The Llama family") ----
// Plain loops for now: correct and deterministic; made fast where a step's profile says so.

// Token embedding without positions (the Llama's: rotary positions come inside attention):
// out[b, t, :] = wte[tokens[b, t], :]. Tokens outside [0, V) throw InvalidArgument naming the
// position and the value, as the encoder's do. Backward adds each dout row into its token's
// row in (b, t) order, so a token seen twice accumulates in that order every run.
void embedding_forward(std::span<float> out,             // (B, T, C)
                       std::span<const int32_t> tokens,  // (B, T)
                       std::span<const float> wte,       // (V, C)
                       size_t B, size_t T, size_t C, size_t V);

void embedding_backward(std::span<float> dwte,            // (V, C) +=
                        std::span<const float> dout,      // (B, T, C)
                        std::span<const int32_t> tokens,  // (B, T)
                        size_t B, size_t T, size_t C, size_t V);

// RMSNorm over the last dimension: out = inp / sqrt(mean(inp^2) + eps) * weight (no mean
// subtracted, no bias). Saves each row's 1/rms for backward. `out` is fp32, or bf16 (each
// value the fp32 result rounded as convert() rounds) for products under kBF16: backward reads
// the input, never the output, so the output may be kept only as the products read it.
void rmsnorm_forward(GemmResult out,                 // (rows, C)
                     std::span<float> rstd,          // (rows) saved for backward
                     std::span<const float> inp,     // (rows, C)
                     std::span<const float> weight,  // (C)
                     size_t rows, size_t C, float eps);

void rmsnorm_backward(std::span<float> dinp,          // (rows, C) +=
                      std::span<float> dweight,       // (C) +=
                      std::span<const float> dout,    // (rows, C)
                      std::span<const float> inp,     // (rows, C)
                      std::span<const float> weight,  // (C)
                      std::span<const float> rstd,    // (rows) from forward
                      size_t rows, size_t C);

// Rotary position embedding, rotate-half (Hugging Face's Llama layout: element i of a head
// pairs with element i + HS/2, so its checkpoints' q and k need no permutation). The table is
// pinned so that a reference computes the same bits: inv_freq[i] = fp32(theta^(-2i/HS)) once,
// angle = fp32(t) * inv_freq[i] in one fp32 multiply, cos and sin of that angle rounded once
// to fp32 from double.
struct RopeTable {
  size_t max_T = 0;
  size_t half = 0;         // HS / 2
  std::vector<float> cos;  // (max_T, half)
  std::vector<float> sin;  // (max_T, half)
};
// InvalidArgument unless head_size is even and positive and theta > 1.
RopeTable rope_table(size_t max_T, size_t head_size, float theta);

// out[b, t, h, i] = x_i cos - x_{i+HS/2} sin, out[.., i + HS/2] = x_{i+HS/2} cos + x_i sin,
// at angle (t, i); t < table.max_T.
void rope_forward(std::span<float> out,        // (B, T, heads, HS)
                  std::span<const float> inp,  // (B, T, heads, HS)
                  const RopeTable& table, size_t B, size_t T, size_t heads, size_t HS);

// The transpose rotation: dinp += R(t)^T dout.
void rope_backward(std::span<float> dinp,        // (B, T, heads, HS) +=
                   std::span<const float> dout,  // (B, T, heads, HS)
                   const RopeTable& table, size_t B, size_t T, size_t heads, size_t HS);

// SwiGLU's gate: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
void swiglu_forward(std::span<float> out,         // (count)
                    std::span<const float> gate,  // (count)
                    std::span<const float> up);   // (count)

void swiglu_backward(std::span<float> dgate,       // (count) +=
                     std::span<float> dup,         // (count) +=
                     std::span<const float> dout,  // (count)
                     std::span<const float> gate,  // (count)
                     std::span<const float> up);   // (count)

// The same, with gate and up side by side in each row as one product over the gate and up
// weights writes them: row r of gate_up is gate (F values) then up (F values). Each value has
// swiglu_forward's bits; `out` is fp32, or bf16 (rounded as convert() rounds) for the product
// that reads it under kBF16. Backward adds into dgate_up, laid out as gate_up, or writes it
// (InputGrad::kOverwrite, the block's use: no zeroing pass first).
void swiglu_rows_forward(GemmResult out,                  // (rows, F)
                         std::span<const float> gate_up,  // (rows, 2F)
                         size_t rows, size_t F);

void swiglu_rows_backward(std::span<float> dgate_up,       // (rows, 2F) += (or =)
                          std::span<const float> dout,     // (rows, F)
                          std::span<const float> gate_up,  // (rows, 2F)
                          size_t rows, size_t F, InputGrad dgate_up_mode = InputGrad::kAdd);

// Grouped-query attention's sharing, as Hugging Face's repeat_kv: kv_heads key (or value)
// heads serve heads query heads, head h reading kv head h / (heads / kv_heads). Forward
// copies each kv head to its group, so the attention kernel sees one per query head;
// backward sums the group's gradients back, in head order.
void repeat_kv_forward(std::span<float> out,        // (rows, heads, HS)
                       std::span<const float> inp,  // (rows, kv_heads, HS)
                       size_t rows, size_t heads, size_t kv_heads, size_t HS);

void repeat_kv_backward(std::span<float> dinp,        // (rows, kv_heads, HS) +=
                        std::span<const float> dout,  // (rows, heads, HS)
                        size_t rows, size_t heads, size_t kv_heads, size_t HS);

// Rotary positions and grouped-query sharing in one pass, from the output of one product over
// the q, k and v weights to the attention kernel's packed input (nn/attention.h). Row (b, t) of
// proj is q (heads x HS), k (kv_heads x HS), v (kv_heads x HS); row (b, t) of qkv is the
// rotated q, the rotated k repeated to every query head of its group (head h reads kv head
// h / (heads / kv_heads), as repeat_kv_forward), and v repeated likewise: bit for bit
// rope_forward on q and on k, then repeat_kv_forward on k and on v. qkv is fp32, or bf16
// (rounded as convert() rounds) for attention's products under kBF16. t < table.max_T.
void rope_qkv_forward(GemmResult qkv,               // (B, T, 3 x heads x HS)
                      std::span<const float> proj,  // (B, T, (heads + 2 kv_heads) x HS)
                      const RopeTable& table, size_t B, size_t T, size_t heads, size_t kv_heads,
                      size_t HS);

// Its transpose, added into dproj: dq = R(t)^T dq, dk = R(t)^T (the group's dk summed in head
// order), dv = the group's dv summed in head order: bit for bit repeat_kv_backward into a
// zeroed buffer then rope_backward for k, repeat_kv_backward for v, rope_backward for q.
void rope_qkv_backward(std::span<float> dproj,       // (B, T, (heads + 2 kv_heads) x HS) +=
                       std::span<const float> dqkv,  // (B, T, 3 x heads x HS)
                       const RopeTable& table, size_t B, size_t T, size_t heads, size_t kv_heads,
                       size_t HS);

// ---- A head and its cross-entropy, a fixed block of rows at a time ----
// logits = inp weight^T (no bias) and the softmax cross-entropy of cross_entropy_forward_
// backward, computed kHeadBlockRows rows at a time, so that a large vocabulary's logits and
// their gradient are held for one block (2 x kHeadBlockRows x V floats of `scratch`), not for
// every row. The loss is the mean over the counted targets of all rows, as one call over them
// would give; dweight (and dinp, optional with it), when not empty, ADD dloss times their
// gradients; dinp without dweight is refused. The block is
// fixed, never an option: dweight sums the blocks in row order, and a product's bits depend
// on its row count (tensor/gemm.h), so one block size is one set of bits. With empty dinp
// and dweight it is the forward alone (a backward that recomputes calls it again with them).
inline constexpr size_t kHeadBlockRows = 64;
size_t head_cross_entropy_scratch_count(size_t V);

// The weight is read only by products (linear_forward, linear_backward), so a unit may claim
// TensorUse::kProductOperand for it. inp may be stored in bf16 under kBF16 (the bf16 pipeline:
// a norm's output kept as the products read it).
float head_cross_entropy(std::span<float> dinp,             // (rows, C) +=, or empty
                         std::span<float> dweight,          // (V, C) +=, or empty: loss only
                         std::span<float> scratch,          // (head_cross_entropy_scratch_count)
                         GemmOperand inp,                   // (rows, C)
                         std::span<const float> weight,     // (V, C)
                         std::span<const int32_t> targets,  // (rows)
                         size_t rows, size_t C, size_t V, GemmCompute compute, float dloss = 1.0f);

}  // namespace zerodp
