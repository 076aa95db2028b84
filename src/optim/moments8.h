// Adam's moments in 8 bits (--optimizer-states int8): blocks of codes with one fp32 scale
// each, laid out in the unit's global coordinates so that the bits do not depend on how the
// unit is sharded.
//
// Blocks. A unit's flat buffer is cut on a grid of kMomentBlock elements; a block is one grid
// cell's part of one tensor (a cell that straddles two tensors gives two blocks), so a block
// never spans two tensors, and a partition cut on the grid (Partition::aligned) never splits
// one. Whether a tensor's moments are quantized is decided by its global size: tensors of
// fewer than kMomentMinNumel elements (biases, norms) keep fp32 moments, as bitsandbytes'
// min_8bit_size and torchao do, since their memory is negligible and they are the parameters
// whose every element gets a different gradient scale.
//
// Codes. Each block stores x / absmax(block) as one of 256 values and absmax as its scale.
// The values are a dynamic-exponent code (Dettmers' dynamic tree quantization, which
// bitsandbytes' and torchao's 8-bit Adam use): seven decades, 10^-7 .. 1, each a linear grid
// of midpoints, finer in the upper decades, so that a block's small elements keep their
// relative precision where a linear int8 code would flush them to zero:
//   first moment m (signed):    0, +-1, and per sign 2^i midpoints in decade [10^(i-7),
//                               10^(i-6)] for i = 1..6 (126), plus one positive value in the
//                               lowest decade: 256 values.
//   second moment v (unsigned): 1, 10^-7, and 2^(i+1) midpoints in decade i = 0..6 (254).
// The unsigned code has no zero: a v that decoded to 0 beside a nonzero m would make the step
// m / eps, the "zero-point problem" of Li et al. (2023, 4-bit optimizer states). Its smallest
// value, 10^-7 of the block's largest v, bounds the step instead; an all-zero block has scale
// 0 and decodes to zeros.
//
// Encoding picks the nearest value (the lower one on a tie: index = the number of midpoints
// between consecutive values that are below x / absmax), in fp32, correctly rounded
// divisions: the same bits on every CPU. Decoding is value * scale.
//
// The update (adamw8_update) decodes a block's m and v to fp32, runs the fp32 AdamW kernel
// on it (optim/adamw.h: the master weights stay fp32), and encodes the new moments with the
// new block maxima. Every block is independent of the others, so any split of a segment at
// block boundaries gives the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "optim/adamw.h"

namespace zerodp {

inline constexpr size_t kMomentBlock = 256;
inline constexpr uint64_t kMomentMinNumel = 4096;
// Whether a tensor of `numel` elements (its global size) keeps its moments in 8 bits.
inline bool moments_quantized(uint64_t numel) { return numel >= kMomentMinNumel; }

// The 256 values of the first (signed) or second (unsigned) moment's code, ascending.
std::span<const float> moment_code(bool is_signed);
// The index of the value nearest `normalized` (ties to the lower index).
uint8_t encode_moment(float normalized, bool is_signed);

// One block: returns the scale (max |x|) and writes x.size() codes.
float quantize_moment_block(std::span<const float> x, bool is_signed, uint8_t* codes);
void dequantize_moment_block(const uint8_t* codes, float scale, bool is_signed,
                             std::span<float> out);

// How many blocks a run of `count` elements holds when its first block has `first` elements
// (1..kMomentBlock; the grid cell's remainder) and the rest are whole but the last.
size_t moment_blocks(size_t count, size_t first);

// What elements [begin, end) of a unit whose tensors have `tensors` elements each (in order,
// from element 0) hold of 8-bit moments: codes (elements of quantized tensors), blocks (their
// parts of the kMomentBlock grid) and fp32 elements (the other tensors'). Additive over cuts
// on block boundaries (grid lines and tensor boundaries).
struct MomentCounts {
  uint64_t codes = 0, blocks = 0, fp32 = 0;
  uint64_t bytes() const { return codes + 4 * blocks + 4 * fp32; }  // one moment's
};
MomentCounts moment_counts(std::span<const uint64_t> tensors, uint64_t begin, uint64_t end);

// A run of one tensor's elements whose moments are quantized: codes per element, scales per
// block, the first block `first` elements long.
struct QuantizedMoments {
  std::span<uint8_t> m, v;
  std::span<float> m_scale, v_scale;
  size_t first = kMomentBlock;
};

// One moment of a run (codes and block scales, the first block `first` long) into fp32.
void dequantize_moment_run(std::span<const uint8_t> codes, std::span<const float> scales,
                           size_t first, bool is_signed, std::span<float> out);
// Both moments of a run, into fp32 (and back: the codes and scales of `m` and `v`).
void dequantize_moments(const QuantizedMoments& q, std::span<float> m, std::span<float> v);
void quantize_moments(std::span<const float> m, std::span<const float> v,
                      const QuantizedMoments& q);

// adamw_update (optim/adamw.h) on a run whose moments are quantized: per block, decode,
// update in fp32, encode. Throws InvalidArgument on mismatched sizes.
void adamw8_update(std::span<float> master, std::span<const float> grad, const QuantizedMoments& q,
                   bool decay, const AdamWConfig& config, int64_t step, float grad_scale);

}  // namespace zerodp
