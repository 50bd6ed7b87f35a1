// Error type and the MK_CHECK macro: every bad input becomes one mk::Error with a message that names the problem.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace mk {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// `text` with every byte that could steer a terminal written as \xNN: C0 and C1 control characters, DEL, bidi
// overrides and bytes that are not UTF-8. Strings read from files (tensor names, JSON values) go into messages
// through this, so that a hostile name cannot clear the screen or hide text. Idempotent: the escapes are printable.
std::string printable(std::string_view text);

}  // namespace mk

// Throws mk::Error with a formatted message when the condition is false.
#define MK_CHECK(condition, ...)                             \
  do {                                                       \
    if (!(condition)) throw ::mk::Error(fmt::format(__VA_ARGS__)); \
  } while (0)
