// Causal multi-head self-attention with explicit forward and backward (llm.c's attention).
//
// Input is the (B, T, 3*C) output of the qkv Linear: for each position, C query channels,
// then C key channels, then C value channels; head h owns channels [h*hs, (h+1)*hs) of each,
// hs = C / NH. Scores are scaled by 1/sqrt(hs), position t attends to positions 0..t.
//
// What forward saves for backward is the layer's business: callers size it with
// attention_saved_count() and the backward workspace with attention_scratch_count(), and
// never look inside: it is each query row's max score and 1 / sum of exponentials, (B, NH, T, 2),
// and backward recomputes the probabilities a block of query rows at a time. Scratch holds
// two (block rows, T) tiles per (batch, head) pair of a group that one batched product covers
// (a few hundred KB at most, so one pair alone once T reaches 1024); no (T, T) matrix is ever
// formed once T exceeds a block (64 rows).
//
// The products multiply in `compute` (tensor/gemm.h), the caller's choice, each kind once per
// group and query block through gemm_batched.
//
// bf16 qkv (the overloads below, compute kBF16 only): for qkv whose values are bf16, the bf16
// forward's out is the fp32 overload's out for the same values widened, rounded with convert(),
// and the bf16 backward's dqkv is the fp32 overload's, bit for bit (same products, same
// strides; the fp32 overload reads qkv's rounded copy, which equals the bf16 values).
//
// Conventions as in layers.h: forward writes, backward adds (+=) into dqkv; results depend
// only on the inputs and the shape. A future position never changes an earlier output: its
// probability is exactly 0, so even its bits do not reach the sums.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "tensor/gemm.h"

namespace zerodp {

struct AttentionDims {
  size_t B = 0;   // batch
  size_t T = 0;   // sequence length
  size_t C = 0;   // channels, a multiple of NH
  size_t NH = 0;  // heads
  size_t head_size() const { return NH == 0 ? 0 : C / NH; }
};

// Elements of the state forward saves for backward; of the workspace either one uses.
size_t attention_saved_count(const AttentionDims& d);
size_t attention_scratch_count(const AttentionDims& d);

void attention_forward(std::span<float> out,        // (B, T, C)
                       std::span<float> saved,      // (attention_saved_count(d))
                       std::span<float> scratch,    // (attention_scratch_count(d))
                       std::span<const float> qkv,  // (B, T, 3*C)
                       const AttentionDims& d, GemmCompute compute);

void attention_backward(std::span<float> dqkv,         // (B, T, 3*C) +=
                        std::span<float> scratch,      // (attention_scratch_count(d))
                        std::span<const float> dout,   // (B, T, C)
                        std::span<const float> qkv,    // (B, T, 3*C), as given to forward
                        std::span<const float> saved,  // (attention_saved_count(d)) from forward
                        const AttentionDims& d, GemmCompute compute);

// bf16 qkv and out; compute must be kBF16 (InvalidArgument otherwise).
void attention_forward(std::span<BFloat16> out,        // (B, T, C)
                       std::span<float> saved,         // (attention_saved_count(d))
                       std::span<float> scratch,       // (attention_scratch_count(d))
                       std::span<const BFloat16> qkv,  // (B, T, 3*C)
                       const AttentionDims& d, GemmCompute compute);

void attention_backward(std::span<float> dqkv,          // (B, T, 3*C) +=
                        std::span<float> scratch,       // (attention_scratch_count(d))
                        std::span<const float> dout,    // (B, T, C)
                        std::span<const BFloat16> qkv,  // (B, T, 3*C), as given to forward
                        std::span<const float> saved,   // (attention_saved_count(d))
                        const AttentionDims& d, GemmCompute compute);

// The products attention_forward and attention_backward make for `d`, each distinct shape
// once (every group of pairs repeats its query blocks' products), as the shape of one entry
// of the batched calls (which is what GemmRecording records for them): what a unit declares
// in Unit::products.
std::vector<GemmShape> attention_products(const AttentionDims& d);

}  // namespace zerodp
