// A small deterministic random generator (splitmix64): the same numbers on every platform and standard library.
#pragma once

#include <cstdint>

namespace mk {

class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}

  uint64_t next_u64() {
    uint64_t z = (state_ += kIncrement);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // As if `draws` numbers had been drawn: the state only ever advances by kIncrement a draw, so any stretch of a
  // sequence can be drawn on its own (random_weights fills a tensor's ranges in parallel to the same values).
  void skip(uint64_t draws) { state_ += draws * kIncrement; }
  // Uniform in [0, 1).
  double uniform() { return double(next_u64() >> 11) * 0x1.0p-53; }
  // Uniform in [low, high).
  float uniform(float low, float high) { return low + float(uniform()) * (high - low); }
  // Uniform on [-sqrt(3) std, sqrt(3) std]: mean 0 and the given standard deviation.
  float symmetric(float std) { return uniform(-1.7320508f * std, 1.7320508f * std); }

 private:
  static constexpr uint64_t kIncrement = 0x9e3779b97f4a7c15ull;
  uint64_t state_;
};

}  // namespace mk
