// Error type and the MK_CHECK macro: every bad input becomes one mk::Error with a message that names the problem.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace mk {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace mk

// Throws mk::Error with a formatted message when the condition is false.
#define MK_CHECK(condition, ...)                             \
  do {                                                       \
    if (!(condition)) throw ::mk::Error(fmt::format(__VA_ARGS__)); \
  } while (0)
