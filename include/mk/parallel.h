// parallel_for: split an index range over the machine's cores with plain std::threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace mk {

inline int hardware_threads() { return std::max(1, int(std::thread::hardware_concurrency())); }

// Calls body(begin, end) on disjoint chunks of [0, count) that together cover it, one chunk per thread. An exception
// thrown by a chunk (or by starting a thread) reaches the caller once every started thread has finished; an
// exception leaving a std::thread would terminate the process instead.
template <typename Body>
void parallel_for(int64_t count, Body&& body, int max_threads = hardware_threads()) {
  const int64_t num_threads = std::min<int64_t>(max_threads, count);
  if (num_threads <= 1) {
    if (count > 0) body(int64_t{0}, count);
    return;
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(num_threads));
  std::vector<std::thread> threads;
  threads.reserve(size_t(num_threads));
  std::exception_ptr start_error;
  for (int64_t t = 0; t < num_threads && !start_error; ++t) {
    const int64_t begin = count * t / num_threads;
    const int64_t end = count * (t + 1) / num_threads;
    try {
      threads.emplace_back([&body, &error = errors[size_t(t)], begin, end] {
        try {
          body(begin, end);
        } catch (...) {
          error = std::current_exception();
        }
      });
    } catch (...) {
      start_error = std::current_exception();
    }
  }
  for (std::thread& thread : threads) thread.join();
  if (start_error) std::rethrow_exception(start_error);
  for (const std::exception_ptr& error : errors)
    if (error) std::rethrow_exception(error);
}

}  // namespace mk
