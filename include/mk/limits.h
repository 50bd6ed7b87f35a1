// Limits on sizes read from flags and files: overflow-checked arithmetic, the largest shapes the engines address,
// and how much memory this host can give a run. Every size from input goes through these before anything is
// allocated from it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "mk/check.h"

namespace mk {

// Rows and columns are int32 in instructions, and every engine indexes token rows and buffer columns with them.
constexpr int64_t kMaxTokens = int64_t(1) << 30;   // batch x seq_len of one pass
constexpr int64_t kMaxColumns = int64_t(1) << 30;  // any width: d_model, d_ff, heads x head_dim, vocab_size
constexpr int64_t kMaxLayers = 0xFFFE;             // layers are 16-bit in instructions, 0xFFFF is kNoLayer
constexpr int64_t kMaxDecodeSpread = 4096;          // tiles a decode phase takes in one round: an SM count

// a * b and a + b, or mk::Error saying that `what` overflows; operands are sizes, so negative ones are refused too.
inline int64_t checked_mul(int64_t a, int64_t b, std::string_view what) {
  int64_t product = 0;
  MK_CHECK(a >= 0 && b >= 0 && !__builtin_mul_overflow(a, b, &product), "{} ({} x {}) overflows 64 bits", what, a, b);
  return product;
}
inline int64_t checked_add(int64_t a, int64_t b, std::string_view what) {
  int64_t sum = 0;
  MK_CHECK(a >= 0 && b >= 0 && !__builtin_add_overflow(a, b, &sum), "{} ({} + {}) overflows 64 bits", what, a, b);
  return sum;
}

// The memory this process may use: physical memory, lowered by RLIMIT_AS and the cgroup's memory.max when they are
// set. A run that needs more fails at some allocation, late and with a bare std::bad_alloc or the OOM killer.
uint64_t host_memory_bytes();

// "1.50 GiB": sizes in messages.
std::string human_bytes(double bytes);

// Throws mk::Error when `bytes` exceed `available`, naming `what` needs them and `where` they would live.
void check_memory(double bytes, double available, std::string_view what, std::string_view where);

}  // namespace mk
