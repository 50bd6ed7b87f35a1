// parallel_for: split an index range over the machine's cores with plain std::threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace mk {

inline int hardware_threads() { return std::max(1, int(std::thread::hardware_concurrency())); }

// Calls body(begin, end) on disjoint chunks of [0, count) that together cover it, one chunk per thread.
template <typename Body>
void parallel_for(int64_t count, Body&& body, int max_threads = hardware_threads()) {
  const int64_t num_threads = std::min<int64_t>(max_threads, count);
  if (num_threads <= 1) {
    if (count > 0) body(int64_t{0}, count);
    return;
  }
  std::vector<std::thread> threads;
  threads.reserve(size_t(num_threads));
  for (int64_t t = 0; t < num_threads; ++t) {
    const int64_t begin = count * t / num_threads;
    const int64_t end = count * (t + 1) / num_threads;
    threads.emplace_back([&body, begin, end] { body(begin, end); });
  }
  for (std::thread& thread : threads) thread.join();
}

}  // namespace mk
