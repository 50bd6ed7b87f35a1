// Host-side bfloat16: storage type and round-to-nearest-even conversions, bit-compatible with __nv_bfloat16.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace mk {

struct bf16 {
  uint16_t bits = 0;
};
static_assert(sizeof(bf16) == 2);

inline float to_float(bf16 value) {
  uint32_t word = uint32_t(value.bits) << 16;
  float result;
  std::memcpy(&result, &word, sizeof(result));
  return result;
}

inline bf16 to_bf16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  if (std::isnan(value)) return bf16{uint16_t((word >> 16) | 0x40)};  // keep NaN a NaN (quiet)
  uint32_t rounding_bias = 0x7fff + ((word >> 16) & 1);
  return bf16{uint16_t((word + rounding_bias) >> 16)};
}

// IEEE half precision, only needed to read F16 checkpoints.
inline float half_to_float(uint16_t half) {
  uint32_t sign = uint32_t(half & 0x8000) << 16;
  uint32_t exponent = (half >> 10) & 0x1f;
  uint32_t mantissa = half & 0x3ff;
  uint32_t word;
  if (exponent == 0) {
    if (mantissa == 0) {
      word = sign;
    } else {  // subnormal: renormalize
      int shift = 0;
      while ((mantissa & 0x400) == 0) {
        mantissa <<= 1;
        ++shift;
      }
      mantissa &= 0x3ff;
      word = sign | uint32_t(127 - 15 - shift + 1) << 23 | mantissa << 13;
    }
  } else if (exponent == 31) {
    word = sign | 0x7f800000u | mantissa << 13;
  } else {
    word = sign | (exponent + 127 - 15) << 23 | mantissa << 13;
  }
  float result;
  std::memcpy(&result, &word, sizeof(result));
  return result;
}

inline float round_to_bf16(float value) { return to_float(to_bf16(value)); }

}  // namespace mk
