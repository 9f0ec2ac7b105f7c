// Dequantization on hand-built blocks. Each format is checked against an element-wise decoder
// written here from the layout description ("element e: which byte, which bits, which scale"),
// independent of the row-at-a-time loops in src/quant, on random block bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "quant/blocks.h"
#include "quant/quant.h"

namespace substrate {
namespace {

constexpr int8_t kNl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                            1,    13,   25,  38,  53,  69,  89,  113};

template <typename Block>
std::vector<Block> RandomBlocks(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Block> b(static_cast<size_t>(n));
  auto* p = reinterpret_cast<uint8_t*>(b.data());
  for (size_t i = 0; i < b.size() * sizeof(Block); ++i) p[i] = static_cast<uint8_t>(rng());
  // Keep the fp16 scales finite and modest: exponent bits of random halfs can be inf/NaN.
  return b;
}

uint16_t Half(float f) { return Fp32ToFp16(f); }
float H(uint16_t h) { return Fp16ToFp32(h); }

int Bit(const uint8_t* bytes, int bit) { return (bytes[bit / 8] >> (bit % 8)) & 1; }

// 6-bit scale/min j of a Q4_K/Q5_K block, from the documented packing.
void K4Scale(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// half_offsets: byte offsets of the block's fp16 fields, set to finite values in [-4, 4].
template <typename Block, typename Fn>
void CheckAgainst(DType type, int block_elems, int n_blocks, std::vector<int> half_offsets,
                  Fn expected_of) {
  auto blocks = RandomBlocks<Block>(n_blocks, 1234u + static_cast<uint32_t>(type));
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> dist(-4.f, 4.f);
  for (auto& b : blocks) {
    for (int off : half_offsets) {
      const uint16_t h = Half(dist(rng));
      std::memcpy(reinterpret_cast<uint8_t*>(&b) + off, &h, 2);
    }
  }
  std::vector<float> out(static_cast<size_t>(n_blocks * block_elems));
  DequantizeRow(type, blocks.data(), out.data(), static_cast<int64_t>(out.size()));
  for (int i = 0; i < n_blocks; ++i)
    for (int e = 0; e < block_elems; ++e)
      ASSERT_FLOAT_EQ(out[static_cast<size_t>(i * block_elems + e)], expected_of(blocks[i], e))
          << DTypeName(type) << " block " << i << " element " << e;
}

TEST(Dequantize, AllTypesSupported) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                  DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ2_K, DType::kQ3_K,
                  DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kIQ4_NL, DType::kIQ4_XS}) {
    EXPECT_TRUE(CanDequantize(t)) << DTypeName(t);
    EXPECT_TRUE(CanQuantize(t)) << DTypeName(t);
  }
  EXPECT_FALSE(CanDequantize(DType::kIQ2_XXS));
}

TEST(Dequantize, Q4_0KnownValues) {
  BlockQ4_0 b;
  b.d = Half(0.5f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  DequantizeRow(DType::kQ4_0, &b, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j - 8) * 0.5f);
    EXPECT_EQ(y[j + 16], (7 - j) * 0.5f);
  }
}

TEST(Dequantize, Q8_0KnownValues) {
  BlockQ8_0 b[2];
  b[0].d = Half(0.25f);
  b[1].d = Half(-2.0f);
  for (int j = 0; j < 32; ++j) b[0].qs[j] = b[1].qs[j] = static_cast<int8_t>(j - 16);
  float y[64];
  DequantizeRow(DType::kQ8_0, b, y, 64);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(y[j], (j - 16) * 0.25f);
    EXPECT_EQ(y[32 + j], (j - 16) * -2.0f);
  }
}

TEST(Dequantize, Q4_1) {
  CheckAgainst<BlockQ4_1>(DType::kQ4_1, 32, 8, {0, 2}, [](const BlockQ4_1& b, int e) {
    const int q = e < 16 ? (b.qs[e] & 15) : (b.qs[e - 16] >> 4);
    return static_cast<float>(q) * H(b.d) + H(b.m);
  });
}

TEST(Dequantize, Q5_0AndQ5_1) {
  CheckAgainst<BlockQ5_0>(DType::kQ5_0, 32, 8, {0}, [](const BlockQ5_0& b, int e) {
    const int lo = e < 16 ? (b.qs[e] & 15) : (b.qs[e - 16] >> 4);
    return static_cast<float>((lo | (Bit(b.qh, e) << 4)) - 16) * H(b.d);
  });
  CheckAgainst<BlockQ5_1>(DType::kQ5_1, 32, 8, {0, 2}, [](const BlockQ5_1& b, int e) {
    const int lo = e < 16 ? (b.qs[e] & 15) : (b.qs[e - 16] >> 4);
    return static_cast<float>(lo | (Bit(b.qh, e) << 4)) * H(b.d) + H(b.m);
  });
}

TEST(Dequantize, Q2_K) {
  CheckAgainst<BlockQ2_K>(DType::kQ2_K, 256, 4, {80, 82}, [](const BlockQ2_K& b, int e) {
    const int half = e / 128, w = e % 128;
    const int q = (b.qs[half * 32 + w % 32] >> (2 * (w / 32))) & 3;
    const int sc = b.scales[e / 16];
    return H(b.d) * static_cast<float>(sc & 15) * static_cast<float>(q) -
           H(b.dmin) * static_cast<float>(sc >> 4);
  });
}

TEST(Dequantize, Q3_K) {
  CheckAgainst<BlockQ3_K>(DType::kQ3_K, 256, 4, {108}, [](const BlockQ3_K& b, int e) {
    const int half = e / 128, w = e % 128;
    const int lo = (b.qs[half * 32 + w % 32] >> (2 * (w / 32))) & 3;
    const int hi = (b.hmask[e % 32] >> (e / 32)) & 1;
    const int j = e / 16;
    const int s_lo = j < 8 ? (b.scales[j] & 15) : (b.scales[j - 8] >> 4);
    const int s_hi = (b.scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    const int scale = (s_lo | (s_hi << 4)) - 32;
    return H(b.d) * static_cast<float>(scale) * static_cast<float>(lo - (hi ? 0 : 4));
  });
}

TEST(Dequantize, Q4_KAndQ5_K) {
  CheckAgainst<BlockQ4_K>(DType::kQ4_K, 256, 4, {0, 2}, [](const BlockQ4_K& b, int e) {
    const int chunk = e / 64, w = e % 64;
    const uint8_t byte = b.qs[chunk * 32 + w % 32];
    const int q = w < 32 ? (byte & 15) : (byte >> 4);
    int sc, m;
    K4Scale(b.scales, e / 32, &sc, &m);
    return H(b.d) * static_cast<float>(sc) * static_cast<float>(q) -
           H(b.dmin) * static_cast<float>(m);
  });
  CheckAgainst<BlockQ5_K>(DType::kQ5_K, 256, 4, {0, 2}, [](const BlockQ5_K& b, int e) {
    const int chunk = e / 64, w = e % 64;
    const uint8_t byte = b.qs[chunk * 32 + w % 32];
    const int q = (w < 32 ? (byte & 15) : (byte >> 4)) | (((b.qh[e % 32] >> (e / 32)) & 1) << 4);
    int sc, m;
    K4Scale(b.scales, e / 32, &sc, &m);
    return H(b.d) * static_cast<float>(sc) * static_cast<float>(q) -
           H(b.dmin) * static_cast<float>(m);
  });
}

TEST(Dequantize, Q6_K) {
  CheckAgainst<BlockQ6_K>(DType::kQ6_K, 256, 4, {208}, [](const BlockQ6_K& b, int e) {
    const int half = e / 128, w = e % 128, g = w / 32, l = w % 32;
    const uint8_t lbyte = b.ql[half * 64 + l + (g & 1) * 32];
    const int lo = g >= 2 ? (lbyte >> 4) : (lbyte & 15);
    const int hi = (b.qh[half * 32 + l] >> (2 * g)) & 3;
    return H(b.d) * static_cast<float>(b.scales[e / 16]) * static_cast<float>((lo | (hi << 4)) - 32);
  });
}

TEST(Dequantize, IQ4_NLAndIQ4_XS) {
  CheckAgainst<BlockIQ4_NL>(DType::kIQ4_NL, 32, 8, {0}, [](const BlockIQ4_NL& b, int e) {
    const int q = e < 16 ? (b.qs[e] & 15) : (b.qs[e - 16] >> 4);
    return H(b.d) * static_cast<float>(kNl[q]);
  });
  CheckAgainst<BlockIQ4_XS>(DType::kIQ4_XS, 256, 4, {0}, [](const BlockIQ4_XS& b, int e) {
    const int ib = e / 32, w = e % 32;
    const uint8_t byte = b.qs[ib * 16 + w % 16];
    const int q = w < 16 ? (byte & 15) : (byte >> 4);
    const int ls = ((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 15) | (((b.scales_h >> (2 * ib)) & 3) << 4);
    return H(b.d) * static_cast<float>(ls - 32) * static_cast<float>(kNl[q]);
  });
}

TEST(Fp16, RoundTripAndRounding) {
  for (float f : {0.f, 1.f, -2.5f, 65504.f, 6.1035156e-05f, 5.9604645e-08f})
    EXPECT_EQ(H(Half(f)), f);
  EXPECT_EQ(Half(1.0f + 1.0f / 2048), Half(1.0f));  // tie -> even
  EXPECT_EQ(Half(1e6f), 0x7c00);                     // overflow -> inf
  EXPECT_EQ(Fp32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToFp32(0x4049), 3.140625f);
}

}  // namespace
}  // namespace substrate
