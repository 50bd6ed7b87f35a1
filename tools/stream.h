// What `mk generate` prints to stdout while it generates: each step's new tokens as ids, as text, or nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mk/tokenizer.h"

namespace mk::cli {

enum class StreamKind : uint8_t { kNone, kIds, kText };

// Prints each decode step's new tokens as they are made, flushed at once.
// - ids: one sequence's on one growing line; a batch's as a line per step, `step N: ID ID -` (- for a sequence that
//   has stopped).
// - text: each sequence's new text through its StreamDecoder, which gives only whole UTF-8 characters; one
//   sequence's text flows as it is made, a batch's comes as a line per step with each sequence's new text as a JSON
//   string, `step N: " the" "" -` (several texts cannot share one terminal line), then `rest: ...` for whatever the
//   decoders still held at the end, if anything.
// The stream of one sequence ends with a newline, so the lines after it (the report, `tokens:`) start a line.
class StepStream {
 public:
  // tokenizer: needed (and must outlive the stream) for kText only. Each sequence's decoder is primed with its
  // prompt, so the first new piece gets the space or joining the prompt's last token calls for.
  StepStream(StreamKind kind, const std::vector<std::vector<int32_t>>& prompts, const Tokenizer* tokenizer);

  void step(int64_t step, const std::vector<int32_t>& made);  // made[b] < 0: sequence b had stopped
  void finish();

 private:
  void step_ids(int64_t step, const std::vector<int32_t>& made);
  void step_text(int64_t step, const std::vector<int32_t>& made);

  StreamKind kind_;
  size_t batch_;
  std::vector<StreamDecoder> decoders_;
  bool stepped_ = false;
};

}  // namespace mk::cli
