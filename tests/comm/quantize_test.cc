// Block quantization against its definition: the packed layout read back by hand, codes
// against round-to-nearest-even of x / scale, the round-trip bound, and the edges (short and
// odd blocks, int4 nibbles, non-finite blocks, split shards, bad sizes).
#include "comm/quantize.h"

#include <cfenv>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "comm_testing.h"
#include "core/error.h"

namespace zerodp {
namespace {

constexpr QuantBits kBitsList[] = {QuantBits::kInt8, QuantBits::kInt4};
constexpr size_t kBlocks[] = {1, 7, 64, 256, 1000, 4097};

using comm_test::from_float;
using comm_test::widen;

std::string label(QuantBits bits, size_t block, size_t count) {
  return "int" + std::to_string(static_cast<int>(bits)) + " block " + std::to_string(block) +
         " count " + std::to_string(count);
}

// The packed form read back from its documented layout, independently of the library.
struct Unpacked {
  std::vector<float> scales;
  std::vector<int> codes;
};

Unpacked unpack(const std::vector<std::byte>& packed, size_t count, BlockQuant q) {
  Unpacked u;
  const size_t blocks = (count + q.block - 1) / q.block;
  u.scales.resize(blocks);
  if (blocks > 0) std::memcpy(u.scales.data(), packed.data(), blocks * sizeof(float));
  const std::byte* values = packed.data() + blocks * sizeof(float);
  for (size_t i = 0; i < count; ++i) {
    if (q.bits == QuantBits::kInt8) {
      u.codes.push_back(static_cast<int8_t>(values[i]));
    } else {
      const auto byte = static_cast<unsigned>(values[i / 2]);
      const unsigned nibble = i % 2 == 0 ? byte & 0xfu : byte >> 4;
      u.codes.push_back(nibble >= 8 ? static_cast<int>(nibble) - 16 : static_cast<int>(nibble));
    }
  }
  return u;
}

template <typename T>
std::vector<std::byte> quantize_vec(const std::vector<T>& x, BlockQuant q) {
  std::vector<std::byte> packed(quantized_bytes(x.size(), q));
  quantize(std::span<const T>(x), packed, q);
  return packed;
}

template <typename T>
std::vector<T> dequantize_vec(const std::vector<std::byte>& packed, size_t count, BlockQuant q) {
  std::vector<T> y(count);
  dequantize(packed, std::span<T>(y), q);
  return y;
}

// Values over several orders of magnitude, so blocks get very different scales.
template <typename T>
std::vector<T> random_values(size_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-3.0f, 3.0f);
  std::vector<T> x(count);
  const float magnitude = std::pow(10.0f, exponent(gen));
  for (size_t i = 0; i < count; ++i) {
    // Change the magnitude now and then, not per element, so a block mixes values near its
    // amax with much smaller ones.
    const float m = i % 97 == 0 ? std::pow(10.0f, exponent(gen)) : magnitude;
    x[i] = from_float<T>(unit(gen) * m);
  }
  return x;
}

float half_ulp_f16_bf16(float y, DType t) {
  // Half the spacing of the 16-bit type at |y|, with the subnormal floor.
  const int mantissa_bits = t == DType::kBF16 ? 7 : 10;
  const int min_exp = t == DType::kBF16 ? -126 : -14;
  int e = 0;
  std::frexp(y, &e);  // y = f * 2^e, f in [0.5, 1)
  const int exp = std::max(e - 1, min_exp);
  return std::ldexp(1.0f, exp - mantissa_bits - 1);
}

template <typename T>
class QuantizeTypedTest : public ::testing::Test {};
using DTypes = ::testing::Types<float, Float16, BFloat16>;
TYPED_TEST_SUITE(QuantizeTypedTest, DTypes);

TYPED_TEST(QuantizeTypedTest, RoundTripIsWithinHalfAScaleAndCodesRoundToNearestEven) {
  using T = TypeParam;
  uint32_t seed = 1;
  for (QuantBits bits : kBitsList) {
    const int qmax = quant_max(bits);
    for (size_t block : kBlocks) {
      const BlockQuant q{bits, block};
      for (size_t count : {size_t{0}, size_t{1}, block - 1, block, block + 1, 10 * block + 3}) {
        SCOPED_TRACE(label(bits, block, count));
        const std::vector<T> x = random_values<T>(count, seed++);
        const std::vector<std::byte> packed = quantize_vec(x, q);
        ASSERT_EQ(packed.size(), ((count + block - 1) / block) * 4 +
                                     (bits == QuantBits::kInt8 ? count : (count + 1) / 2));
        const Unpacked u = unpack(packed, count, q);
        for (size_t k = 0; k < u.scales.size(); ++k) {
          float amax = 0;
          for (size_t i = k * block; i < std::min(count, (k + 1) * block); ++i) {
            amax = std::max(amax, std::fabs(widen(x[i])));
          }
          ASSERT_EQ(u.scales[k], amax / static_cast<float>(qmax)) << "block " << k;
        }
        const std::vector<float> wide = dequantize_vec<float>(packed, count, q);
        for (size_t i = 0; i < count; ++i) {
          const float xi = widen(x[i]);
          const float scale = u.scales[i / block];
          const int code = u.codes[i];
          ASSERT_LE(std::abs(code), qmax) << "element " << i;
          if (scale > 0) {
            // Default rounding mode: nearbyint rounds to nearest, ties to even.
            const float want = std::clamp(std::nearbyint(xi / scale), static_cast<float>(-qmax),
                                          static_cast<float>(qmax));
            ASSERT_EQ(static_cast<float>(code), want) << "element " << i << " x " << xi;
          } else {
            ASSERT_EQ(code, 0) << "element " << i;
          }
          ASSERT_EQ(wide[i], static_cast<float>(code) * scale) << "element " << i;
          const double err = std::fabs(static_cast<double>(xi) - static_cast<double>(wide[i]));
          // scale / 2, plus the fp32 rounding of x / scale and of q * scale.
          ASSERT_LE(err, 0.5 * scale * (1 + 1e-6) + std::fabs(xi) * 1e-7) << "element " << i;
        }
        // A 16-bit output is the fp32 value rounded once, so within scale / 2 plus its rounding.
        if constexpr (!std::is_same_v<T, float>) {
          const std::vector<T> narrow = dequantize_vec<T>(packed, count, q);
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(narrow[i], from_float<T>(wide[i])) << "element " << i;
            const float xi = widen(x[i]);
            const double err =
                std::fabs(static_cast<double>(xi) - static_cast<double>(widen(narrow[i])));
            ASSERT_LE(err, 0.5 * u.scales[i / block] * (1 + 1e-6) + std::fabs(xi) * 1e-7 +
                               half_ulp_f16_bf16(wide[i], dtype_of<T>()))
                << "element " << i;
          }
        }
      }
    }
  }
}

TYPED_TEST(QuantizeTypedTest, MultiplesOfTheScaleSurviveExactly) {
  using T = TypeParam;
  // A power of two and a scale with a 3 in it: both make x / scale and q * scale exact.
  for (float unit : {std::ldexp(1.0f, -5), 3.0f * std::ldexp(1.0f, -7)}) {
    for (QuantBits bits : kBitsList) {
      const int qmax = quant_max(bits);
      // bf16 has 8 significant bits: 127 * 3 does not fit, so that pair proves nothing.
      const float top = static_cast<float>(qmax) * unit;
      if (widen(from_float<T>(top)) != top) continue;
      const BlockQuant q{bits, 16};
      std::vector<T> x;
      std::mt19937 gen(7);
      std::uniform_int_distribution<int> mult(-qmax, qmax);
      for (int b = 0; b < 5; ++b) {
        for (int i = 0; i < 16; ++i) {
          // Each block holds +-qmax once, so its scale is exactly `unit`.
          const int m = i == b ? (b % 2 ? -qmax : qmax) : mult(gen);
          x.push_back(from_float<T>(static_cast<float>(m) * unit));
        }
      }
      const std::vector<std::byte> packed = quantize_vec(x, q);
      for (float s : unpack(packed, x.size(), q).scales) ASSERT_EQ(s, unit);
      const std::vector<T> y = dequantize_vec<T>(packed, x.size(), q);
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_EQ(widen(y[i]), widen(x[i])) << "element " << i << " unit " << unit;
      }
    }
  }
}

TEST(QuantizeTest, Int4PacksTwoPerByteLowNibbleFirst) {
  // Scale 1 (amax 7): the codes are the values. Odd count: the last byte's high nibble is 0.
  const std::vector<float> x = {1, -1, 7, -7, 0, 3, -4, 2, 5};
  const BlockQuant q{QuantBits::kInt4, 16};
  const std::vector<std::byte> packed = quantize_vec(x, q);
  ASSERT_EQ(packed.size(), 4u + 5u);
  float scale;
  std::memcpy(&scale, packed.data(), 4);
  EXPECT_EQ(scale, 1.0f);
  const std::vector<uint8_t> want = {0xf1, 0x97, 0x30, 0x2c, 0x05};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(static_cast<unsigned>(packed[4 + i]), want[i]) << "byte " << i;
  }
  EXPECT_EQ(dequantize_vec<float>(packed, x.size(), q), x);
}

TEST(QuantizeTest, Int4KeepsTheSignOfEveryCode) {
  std::vector<float> x;
  for (int v = -7; v <= 7; ++v) x.push_back(static_cast<float>(v));
  for (size_t block : {size_t{3}, size_t{15}, size_t{64}}) {
    // Every block of 3 needs a +-7 to have scale 1; give it a leading 7 of the right size.
    std::vector<float> in = x;
    if (block == 3) {
      for (size_t i = 0; i < in.size(); i += 3) in[i] = i % 2 ? -7.0f : 7.0f;
    }
    const BlockQuant q{QuantBits::kInt4, block};
    const std::vector<std::byte> packed = quantize_vec(in, q);
    const Unpacked u = unpack(packed, in.size(), q);
    for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(u.codes[i], static_cast<int>(in[i]));
    EXPECT_EQ(dequantize_vec<float>(packed, in.size(), q), in) << "block " << block;
  }
}

TEST(QuantizeTest, TiesRoundToEvenWhateverTheRoundingMode) {
  // amax 127 gives scale 1, so x / scale is x exactly.
  const std::vector<float> x = {127, 2.5f, 3.5f, -2.5f, -3.5f, 0.5f, -0.5f, 1.5f, 126.5f, -126.5f};
  const std::vector<float> want = {127, 2, 4, -2, -4, 0, 0, 2, 126, -126};
  const BlockQuant q{QuantBits::kInt8, 64};
  for (int mode : {FE_TONEAREST, FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO}) {
    ASSERT_EQ(std::fesetround(mode), 0);
    const std::vector<std::byte> packed = quantize_vec(x, q);
    std::fesetround(FE_TONEAREST);
    EXPECT_EQ(dequantize_vec<float>(packed, x.size(), q), want) << "rounding mode " << mode;
  }
}

TEST(QuantizeTest, ATensorShorterThanABlockIsOneShortBlock) {
  const std::vector<float> x = {0.25f, -3.0f, 1.0f, 2.0f, -0.5f};
  for (QuantBits bits : kBitsList) {
    const BlockQuant q{bits, 256};
    const std::vector<std::byte> packed = quantize_vec(x, q);
    EXPECT_EQ(packed.size(), 4 + (bits == QuantBits::kInt8 ? 5u : 3u));
    const Unpacked u = unpack(packed, x.size(), q);
    ASSERT_EQ(u.scales.size(), 1u);
    EXPECT_EQ(u.scales[0], 3.0f / static_cast<float>(quant_max(bits)));
    EXPECT_EQ(u.codes[1], -quant_max(bits));
  }
}

TEST(QuantizeTest, AllZeroBlocksHaveScaleZeroAndDequantizeToZero) {
  std::vector<float> x(40, 0.0f);
  x[3] = -0.0f;
  x[30] = 889.0f;  // block 1 of 2 is not zero: 7 * 127, an exact scale for int8 and int4
  for (QuantBits bits : kBitsList) {
    const BlockQuant q{bits, 20};
    const std::vector<std::byte> packed = quantize_vec(x, q);
    const Unpacked u = unpack(packed, x.size(), q);
    EXPECT_EQ(u.scales[0], 0.0f);
    for (size_t i = 0; i < 20; ++i) EXPECT_EQ(u.codes[i], 0);
    const std::vector<float> y = dequantize_vec<float>(packed, x.size(), q);
    EXPECT_EQ(y, x);
  }
}

// A block of subnormals gets a subnormal scale, rounded coarsely, so x / scale can pass qmax:
// the clamp keeps the codes in range (an int8 code of 128 would wrap to -128).
TEST(QuantizeTest, SubnormalBlocksClampTheirCodes) {
  const float unit = std::numeric_limits<float>::denorm_min();
  for (QuantBits bits : kBitsList) {
    const int qmax = quant_max(bits);
    for (float amax_units : {10.0f, 190.0f, 1000.0f}) {
      const float amax = amax_units * unit;
      const std::vector<float> x = {amax, -amax, 0.5f * amax, 3 * unit, -unit, 0.0f};
      const BlockQuant q{bits, 8};
      const std::vector<std::byte> packed = quantize_vec(x, q);
      const Unpacked u = unpack(packed, x.size(), q);
      ASSERT_EQ(u.scales[0], amax / static_cast<float>(qmax));
      if (u.scales[0] == 0) {
        // amax / qmax underflowed to 0 (10 units for int8): the block is all zero codes.
        for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(u.codes[i], 0) << "element " << i;
        continue;
      }
      for (size_t i = 0; i < x.size(); ++i) {
        const float want = std::clamp(std::nearbyint(x[i] / u.scales[0]), static_cast<float>(-qmax),
                                      static_cast<float>(qmax));
        EXPECT_EQ(static_cast<float>(u.codes[i]), want)
            << "int" << static_cast<int>(bits) << " amax " << amax_units << " element " << i;
      }
      // The scale may round up, leaving amax below qmax, but never wraps the sign.
      EXPECT_GT(u.codes[0], 0);
      EXPECT_LT(u.codes[1], 0);
    }
  }
}

// Two ranks' shards split at any offset: each is quantized with blocks from its own start,
// so its packed form depends only on its own elements.
TEST(QuantizeTest, HalvesQuantizeWithTheirOwnBlocks) {
  for (QuantBits bits : kBitsList) {
    const int qmax = quant_max(bits);
    const BlockQuant q{bits, 7};
    const std::vector<float> x = random_values<float>(45, 99);
    for (size_t split = 0; split <= x.size(); ++split) {
      SCOPED_TRACE("int" + std::to_string(static_cast<int>(bits)) + " split " +
                   std::to_string(split));
      // The halves in place, as views of one buffer, and as copies of their own.
      const std::span<const float> whole(x);
      for (auto [off, len] : {std::pair{size_t{0}, split}, std::pair{split, x.size() - split}}) {
        std::vector<std::byte> packed(quantized_bytes(len, q));
        quantize(whole.subspan(off, len), packed, q);
        const std::vector<float> copy(x.begin() + static_cast<ptrdiff_t>(off),
                                      x.begin() + static_cast<ptrdiff_t>(off + len));
        EXPECT_EQ(packed, quantize_vec(copy, q));
        const Unpacked u = unpack(packed, len, q);
        for (size_t k = 0; k < u.scales.size(); ++k) {
          float amax = 0;
          for (size_t i = k * q.block; i < std::min(len, (k + 1) * q.block); ++i) {
            amax = std::max(amax, std::fabs(copy[i]));
          }
          ASSERT_EQ(u.scales[k], amax / static_cast<float>(qmax)) << "block " << k;
        }
        const std::vector<float> y = dequantize_vec<float>(packed, len, q);
        for (size_t i = 0; i < len; ++i) {
          ASSERT_LE(std::fabs(y[i] - copy[i]), 0.5f * u.scales[i / q.block] * (1 + 1e-6f))
              << "element " << i;
        }
      }
    }
  }
}

TYPED_TEST(QuantizeTypedTest, ANonFiniteValuePoisonsOnlyItsBlock) {
  using T = TypeParam;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  for (QuantBits bits : kBitsList) {
    for (float bad : {kNaN, kInf, -kInf}) {
      const BlockQuant q{bits, 64};
      const size_t count = 64 * 3 + 5;  // blocks 0..2 whole, block 3 short
      const std::vector<T> clean = random_values<T>(count, 5);
      std::vector<T> x = clean;
      x[64 + 10] = from_float<T>(bad);
      x[64 * 3 + 4] = from_float<T>(bad);  // the last element of the short block
      const std::vector<std::byte> packed = quantize_vec(x, q);
      const std::vector<std::byte> clean_packed = quantize_vec(clean, q);
      const std::vector<float> y = dequantize_vec<float>(packed, count, q);
      const std::vector<T> y16 = dequantize_vec<T>(packed, count, q);
      const std::vector<float> want = dequantize_vec<float>(clean_packed, count, q);
      std::vector<float> acc(count, 1.0f);
      dequantize_add(packed, acc, q);
      for (size_t i = 0; i < count; ++i) {
        const size_t k = i / 64;
        if (k == 1 || k == 3) {
          ASSERT_TRUE(std::isnan(y[i])) << "element " << i << " bad " << bad;
          ASSERT_TRUE(std::isnan(widen(y16[i]))) << "element " << i << " bad " << bad;
          ASSERT_TRUE(std::isnan(acc[i])) << "element " << i << " bad " << bad;
        } else {
          ASSERT_EQ(y[i], want[i]) << "element " << i << " bad " << bad;
          ASSERT_EQ(acc[i], 1.0f + want[i]) << "element " << i << " bad " << bad;
        }
      }
    }
  }
}

TEST(QuantizeTest, DequantizeAddAddsExactlyCodeTimesScale) {
  for (QuantBits bits : kBitsList) {
    for (size_t block : {size_t{7}, size_t{256}, size_t{4097}}) {
      SCOPED_TRACE(label(bits, block, 10 * block + 3));
      const BlockQuant q{bits, block};
      const size_t count = 10 * block + 3;
      const std::vector<BFloat16> g = random_values<BFloat16>(count, 11);
      const std::vector<std::byte> packed = quantize_vec(g, q);
      const Unpacked u = unpack(packed, count, q);
      std::vector<float> acc(count);
      std::vector<float> want(count);
      std::mt19937 gen(3);
      std::uniform_real_distribution<float> dist(-50.0f, 50.0f);
      for (size_t i = 0; i < count; ++i) acc[i] = want[i] = dist(gen);
      for (int round = 0; round < 2; ++round) {
        dequantize_add(packed, acc, q);
        for (size_t i = 0; i < count; ++i) {
          want[i] += static_cast<float>(u.codes[i]) * u.scales[i / block];
        }
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(acc[i], want[i]) << "element " << i;
      }
    }
  }
}

TEST(QuantizeTest, RepeatedRunsGiveTheSameBytes) {
  const std::vector<Float16> x = random_values<Float16>(50000, 21);
  for (QuantBits bits : kBitsList) {
    const BlockQuant q{bits, 256};
    EXPECT_EQ(quantize_vec(x, q), quantize_vec(x, q));
  }
}

TEST(QuantizeTest, BadSizesAreRefusedNamingThem) {
  const std::vector<float> x(100, 1.0f);
  const BlockQuant q{QuantBits::kInt8, 32};
  ASSERT_EQ(quantized_bytes(100, q), 4u * 4u + 100u);
  auto expect_message = [](auto&& call, std::vector<std::string> parts) {
    try {
      call();
      ADD_FAILURE() << "no InvalidArgument; wanted one naming " << parts[0];
    } catch (const InvalidArgument& e) {
      for (const std::string& p : parts)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  std::vector<std::byte> short_out(115);
  expect_message([&] { quantize(std::span<const float>(x), short_out, q); },
                 {"115 bytes", "100 elements", "116 bytes"});
  std::vector<std::byte> long_in(117);
  std::vector<float> y(100);
  expect_message([&] { dequantize(long_in, std::span<float>(y), q); },
                 {"117 bytes", "100 elements", "116 bytes"});
  expect_message([&] { dequantize_add(long_in, y, q); }, {"117 bytes", "100", "116 bytes"});
  const BlockQuant zero{QuantBits::kInt8, 0};
  expect_message([&] { (void)quantized_bytes(10, zero); }, {"block 0"});
  std::vector<std::byte> out(116);
  expect_message([&] { quantize(std::span<const float>(x), out, zero); }, {"block 0"});
  expect_message(
      [&] {
        (void)quantized_bytes(10, BlockQuant{static_cast<QuantBits>(3), 8});
      },
      {"3 bits"});
  expect_message(
      [&] {
        (void)quantized_bytes(std::numeric_limits<size_t>::max(), BlockQuant{QuantBits::kInt8, 1});
      },
      {std::to_string(std::numeric_limits<size_t>::max())});
}

}  // namespace
}  // namespace zerodp
