// Block quantization for quantized collectives (ZeRO++'s qwZ and qgZ).
//
// qwZ: a stage-3 weight all-gather carries int8 values with one fp32 scale per block; the owner
// quantizes its shard from its bf16/f16/f32 copy and every rank dequantizes on arrival.
// qgZ: gradients travel as int8 or int4 blocks and the owner adds them, dequantized, into its
// fp32 accumulator in a fixed order.
//
// Packed form of `count` elements: ceil(count / block) fp32 scales (native byte order, no
// alignment assumed), then the values: count bytes for int8, ceil(count / 2) for int4 (two
// per byte, element 2i in the low nibble of byte i, 2i + 1 in the high nibble, each a two's
// complement nibble; an odd count leaves the last high nibble 0).
//
// Blocks start at element 0 of the buffer, so a shard is quantized on its own and its blocks
// never reach into a neighbouring rank's shard; block k covers [k * block, min((k + 1) * block,
// count)), and only the last may be short. Quantization is symmetric: scale_k = amax_k / qmax
// (qmax 127 for int8, 7 for int4) with amax_k = max |x| over the block in fp32 (16-bit inputs
// widened exactly), and q = x / scale_k rounded to nearest even, clamped to [-qmax, qmax], so
// |x - q * scale_k| <= scale_k / 2 (before the output's own rounding). An all-zero block has
// scale 0 and values 0. A block holding a NaN or an infinity gets a NaN scale and values 0, so
// everything it dequantizes to is NaN: an overflowed gradient stays visible to the overflow
// check after a quantized reduce-scatter.
//
// Determinism: every result is a function of its own block only, computed element by element
// in IEEE fp32 (division, multiplication, comparison, truncating conversion) plus an exact
// integer max, so the bits do not depend on the CPU's vector width, on buffer addresses or on
// how the work is split. Rounding to nearest even is done from the truncated value, not with
// the current rounding mode. As for all fp32 arithmetic in zerodp, this assumes the default
// MXCSR (no flush-to-zero): with it, blocks whose scale is subnormal would differ.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "comm/buffer.h"
#include "comm/comm_options.h"
#include "tensor/dtype.h"

namespace zerodp {

enum class QuantBits : uint8_t { kInt4 = 4, kInt8 = 8 };

struct BlockQuant {
  QuantBits bits = QuantBits::kInt8;
  size_t block = 256;  // elements per scale; at least 1
};

// The largest code magnitude: 127 for int8, 7 for int4.
constexpr int quant_max(QuantBits bits) { return bits == QuantBits::kInt4 ? 7 : 127; }

// qgZ's quantization from a communicator's options (CommOptions::qgz_bits is 4 or 8).
BlockQuant qgz_quant(const CommOptions& options);

// Throws InvalidArgument naming the block size or bit width when `q` is unusable.
void check_block_quant(BlockQuant q);

// Bytes of the packed form of `count` elements (see above). Validates `q`.
size_t quantized_bytes(size_t count, BlockQuant q);

// Quantizes `in` into `out`, which must hold exactly quantized_bytes(in.count, q) bytes.
void quantize(ConstBuffer in, std::span<std::byte> out, BlockQuant q);

// x' = q * scale in fp32, rounded once to out.dtype. `in` must hold exactly
// quantized_bytes(out.count, q) bytes.
void dequantize(std::span<const std::byte> in, MutableBuffer out, BlockQuant q);

// acc[i] += q_i * scale_k in fp32, element by element: the accumulating form for gradients.
// `in` must hold exactly quantized_bytes(acc.size(), q) bytes.
void dequantize_add(std::span<const std::byte> in, std::span<float> acc, BlockQuant q);

// The same arithmetic for blocks the caller lays out: DiLoCo's outer gradients
// (train/outer_step.h) are quantized in blocks fixed in the model's coordinates, whose parts
// lie on different ranks, so a block's amax is the max of its parts' (gathered by the caller)
// and its scale the same on every rank.
// The largest |x| of `x`, +inf where one is not finite (so the max over parts keeps it).
float abs_max(std::span<const float> x);
// A block's scale from its amax: amax / qmax, NaN for an infinite amax.
float block_scale(float amax, QuantBits bits);
// The codes of `x` under `scale`, as quantize() rounds them; 0 where the scale is 0 or NaN.
void quantize_codes(std::span<const float> x, float scale, QuantBits bits, std::span<int8_t> codes);
// Codes packed as quantize() packs its values (int8 as they are, int4 two per byte), and back.
size_t code_bytes(size_t count, QuantBits bits);
void pack_codes(std::span<const int8_t> codes, QuantBits bits, std::span<std::byte> out);
void unpack_codes(std::span<const std::byte> in, QuantBits bits, std::span<int8_t> codes);

}  // namespace zerodp
