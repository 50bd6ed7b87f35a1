// StepStream: `mk generate`'s stdout while tokens are made, as ids or as text cut at whole UTF-8 characters.
#include "stream.h"

#include <fmt/format.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "mk/check.h"

namespace mk::cli {

namespace {

// A piece of text as a JSON string: quotes, backslashes and control characters escaped, so that a batch's pieces
// stay on their step's line and their boundaries show; UTF-8 is kept as it is.
std::string quoted_piece(const std::string& piece) {
  return nlohmann::json(piece).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

StepStream::StepStream(StreamKind kind, const std::vector<std::vector<int32_t>>& prompts, const Tokenizer* tokenizer)
    : kind_(kind), batch_(prompts.size()) {
  if (kind_ != StreamKind::kText) return;
  MK_CHECK(tokenizer != nullptr, "a text stream needs a tokenizer");
  for (const std::vector<int32_t>& prompt : prompts) {
    decoders_.push_back(tokenizer->stream_decoder());
    // The prompt's own text is not printed: like the ids stream, the text stream holds only what is new.
    for (int32_t id : prompt) decoders_.back().push(id);
  }
}

void StepStream::step(int64_t step, const std::vector<int32_t>& made) {
  stepped_ = true;
  if (kind_ == StreamKind::kIds) step_ids(step, made);
  if (kind_ == StreamKind::kText) step_text(step, made);
  std::fflush(stdout);
}

void StepStream::step_ids(int64_t step, const std::vector<int32_t>& made) {
  if (batch_ == 1) {
    fmt::print("{}{}", step == 0 ? "" : " ", made[0]);
    return;
  }
  std::string line;
  for (int32_t id : made) line += id < 0 ? " -" : fmt::format(" {}", id);
  fmt::print("step {}:{}\n", step, line);
}

void StepStream::step_text(int64_t step, const std::vector<int32_t>& made) {
  if (batch_ == 1) {
    if (made[0] >= 0) fmt::print("{}", decoders_[0].push(made[0]));
    return;
  }
  std::string line;
  for (size_t b = 0; b < batch_; ++b)
    line += made[b] < 0 ? std::string(" -") : fmt::format(" {}", quoted_piece(decoders_[b].push(made[b])));
  fmt::print("step {}:{}\n", step, line);
}

void StepStream::finish() {
  if (kind_ == StreamKind::kText) {
    std::vector<std::string> rest;
    bool any = false;
    for (StreamDecoder& decoder : decoders_) {
      rest.push_back(decoder.finish());
      any = any || !rest.back().empty();
    }
    if (batch_ == 1) {
      fmt::print("{}", rest[0]);
    } else if (any) {
      std::string line;
      for (const std::string& piece : rest) line += fmt::format(" {}", quoted_piece(piece));
      fmt::print("rest:{}\n", line);
    }
  }
  if (kind_ != StreamKind::kNone && batch_ == 1 && stepped_) fmt::print("\n");
  std::fflush(stdout);
}

}  // namespace mk::cli
