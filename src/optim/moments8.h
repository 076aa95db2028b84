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
// Codes. Each block stores y = x / absmax(block), in [-1, 1], as one byte and absmax as its
// scale. The byte is an 8-bit float on a power-of-two grid (MomentCode::kFloat8, named
// "e3m4/ue4m4"), so that encoding and decoding are integer operations on a float's bits that
// the compiler vectorizes, with no table:
//   first moment m (signed), "e3m4": 0, and per sign the 127 magnitudes 2^-8 * (1 + k/16)
//     for k = 2..15, then 2^e * (1 + k/16) for e = -7..-1, k = 0..15, and 1. Stored as
//     128 + c for +value(c), 128 - c for -value(c) (c = 0..127, value(127) = 1), so codes
//     order as values do; byte 0 would be -value(128) = -1.0625, which encoding never gives.
//   second moment v (unsigned), "ue4m4": 2^e * (1 + k/16) from 2^-16 * (1 + 1/16) (byte 0)
//     to 1 (byte 255); no zero.
// A magnitude's code is the float's top bits minus a constant (bits >> 19, the exponent and
// 4 mantissa bits, minus 1905 or 1777, placing 1.0 at the last code), so decoding shifts the
// code back into a float: exact, then one multiply by the scale.
//
// Why these: the steps that matter are those of a block's large elements, and a float's
// relative precision is the same in every binade, so the code spends as many mantissa bits as
// the range allows. v needs the range: an element whose gradient is 2^-k of the block's
// largest has v ~ 2^-2k; 16 binades keep every k <= 8 to within 1/32, and below that v stops at
// the floor, which only shrinks the step (the safe side). m needs only the square root of
// v's range: that element's m is ~2^-k of the block's largest, and past k = 8 its v is on the
// floor, its step already cut by 2^(k-8) whatever m keeps. So m gets 4 mantissa bits too (3
// exponent bits) and flushes to 0 below 2^-8.8. Alternatives: e4m3 for m (torchao's AdamWFp8 uses
// float8_e4m3fn for both moments, scale absmax/448) halves m's precision for range its step cannot
// use; ue5m3 for v reaches 2^-32 at twice ue4m4's error; ue3m5 halves the error but stops at 2^-8
// (gradients within 16x of the block's largest). bitsandbytes' dynamic code (and the decades code
// here before, MomentCode::kDecades) is finer near 1 (the old v: 0.35 % at 1, here 1.6 %) but needs
// a table to encode: 0.88 ns per element, more than the update it serves. The signed code's two
// zeros of a sign-magnitude byte would waste a code; the offset layout wastes byte 0 instead and
// keeps the bytes monotone.
//
// v's code has no zero: a v that decoded to 0 beside a nonzero m would make the step m / eps,
// the "zero-point problem" of Li et al. (2023, 4-bit optimizer states); a tiny v rounds up to
// the smallest value, 2^-16 * 1.0625 of the block's largest, which bounds the step instead. An
// all-zero block has scale 0 and decodes to zeros.
//
// Encoding picks the nearest value, on a tie the one of larger magnitude (the rounding adds
// half a code step to the bits), from y = x * fp32(1 / absmax): one correctly rounded
// division per block, one multiply per element, then integer operations: the same bits on
// every CPU, vector width and target clone.
//
// The update (adamw8_update) goes block by block in one pass: decode m and v to fp32, the fp32
// AdamW element update (optim/adamw_kernel.h, as the fp32 kernel runs it: the master weights
// stay fp32), then encode the new moments with the new block maxima: the bits of decoding, the
// fp32 kernel and encoding in turn. Every block is independent of the others, so any split of
// a segment at block boundaries gives the same bits.
//
// Checkpoints written before this code hold decades codes; dequantize_moment_run decodes them
// given MomentCode::kDecades (the loader then encodes the values in the current code).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "optim/adamw.h"

namespace zerodp {

inline constexpr size_t kMomentBlock = 256;
inline constexpr uint64_t kMomentMinNumel = 4096;
// Whether a tensor of `numel` elements (its global size) keeps its moments in 8 bits.
inline bool moments_quantized(uint64_t numel) { return numel >= kMomentMinNumel; }

// The codes a run of moments may be stored in. Only the current one is ever encoded; kDecades
// is the dynamic-exponent table of checkpoints written before kFloat8, kept for decoding.
enum class MomentCode : uint8_t { kDecades, kFloat8 };
inline constexpr MomentCode kCurrentMomentCode = MomentCode::kFloat8;
// The name a checkpoint's meta.json records: "decades", "e3m4/ue4m4". Stable.
std::string_view moment_code_name(MomentCode code);
// The code of a name moment_code_name gives; nullopt for any other string.
std::optional<MomentCode> parse_moment_code(std::string_view name);

// The 256 values of the first (signed) or second (unsigned) moment's code, indexed by code
// byte; ascending (the bytes order as their values do).
std::span<const float> moment_code(bool is_signed, MomentCode code = kCurrentMomentCode);
// The current code's byte for `normalized` (x / absmax): the nearest value, on a tie the one
// of larger magnitude.
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

// One moment of a run (codes and block scales, the first block `first` long) into fp32; `code`
// is the one the codes were written in.
void dequantize_moment_run(std::span<const uint8_t> codes, std::span<const float> scales,
                           size_t first, bool is_signed, std::span<float> out,
                           MomentCode code = kCurrentMomentCode);
// Both moments of a run, into fp32 (and back: the codes and scales of `m` and `v`).
void dequantize_moments(const QuantizedMoments& q, std::span<float> m, std::span<float> v);
void quantize_moments(std::span<const float> m, std::span<const float> v,
                      const QuantizedMoments& q);

// adamw_update (optim/adamw.h) on a run whose moments are quantized: per block, decode,
// update in fp32, encode. Throws InvalidArgument on mismatched sizes.
void adamw8_update(std::span<float> master, std::span<const float> grad, const QuantizedMoments& q,
                   bool decay, const AdamWConfig& config, int64_t step, float grad_scale);

}  // namespace zerodp
