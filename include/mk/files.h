// Files as a hostile user might give them. Inputs must be regular files of bounded size (a FIFO blocks, /dev/zero
// never ends, a directory means nothing); JSON is read without duplicate keys or deep nesting; outputs are checked
// before any work, never land on an input, and are written atomically so that a failed write destroys nothing.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mk {

// A regular file open for reading. Opening never blocks: a FIFO, device, socket or directory is refused with a
// message saying what it is, and so is a path that cannot be opened (missing, a symbolic link loop, ...).
class InputFile {
 public:
  explicit InputFile(const std::filesystem::path& path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }  // at opening
  // Reads exactly out.size() bytes at `offset`; a file that has become shorter is an error.
  void read_at(uint64_t offset, std::span<uint8_t> out) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// The whole file, refused before reading when it is larger than `max_bytes`.
std::string read_file(const std::filesystem::path& path, uint64_t max_bytes);

// Whether the directory has an entry of that name. A dangling symbolic link, a loop or a path whose parent cannot be
// read counts as one: reading it then names what is wrong, where "no such file" would pass it over.
bool has_entry(const std::filesystem::path& path);

// Parses JSON text; errors name `source`. Refuses what a DOM would let a small file make large or ambiguous: nesting
// deeper than kMaxJsonDepth and an object key given twice (which nlohmann would silently resolve to the last).
constexpr int kMaxJsonDepth = 64;
nlohmann::json parse_json(std::string_view text, const std::string& source);
nlohmann::json read_json_file(const std::filesystem::path& path, uint64_t max_bytes);

// A JSON number as a whole int64 (integers, and floats with an integral value below 2^62), or a finite double;
// nothing otherwise, including booleans, which nlohmann would convert. Callers name the field in their errors.
std::optional<int64_t> json_to_int64(const nlohmann::json& value);
std::optional<double> json_to_double(const nlohmann::json& value);
// value.dump(), cut to about 80 characters and escaped: a value quoted in an error message.
std::string json_excerpt(const nlohmann::json& value);
// eos_token_id / bos_token_id as the config files write them: an id or a list of ids, each a whole number in
// [0, 2^31) (bounded before the cast: 2^32 would become id 0); empty for null. `what` names the field in the error.
std::vector<int32_t> json_token_ids(const nlohmann::json& value, const std::string& what);

// ---- a model directory's JSON config files ----

// The largest config file read (config.json, generation_config.json, mk_config.json): real ones are a few KB, and a
// DOM of a hostile one costs many times its size.
constexpr uint64_t kMaxConfigJsonBytes = uint64_t(4) << 20;
// tokenizer_config.json lists every added token (~180 bytes each as transformers writes it), and Llama-shaped speech
// models add tens of thousands (audio codes): past 4 MiB. Capped as tokenizer.json is, whose DOM the tokenizer builds
// anyway.
constexpr uint64_t kMaxTokenizerConfigJsonBytes = uint64_t(256) << 20;

// A model directory's JSON config file, read by the same rules for every reader (the model config, the EOS ids, the
// tokenizer's BOS and EOS) so that one file gets one verdict and one message: an input file as above of at most
// max_bytes (the file's cap above), parsed by parse_json, and a JSON object; anything else would be read as a file
// naming nothing (no BOS, no EOS) and silently change what the model does.
nlohmann::json read_config_json(const std::filesystem::path& path, uint64_t max_bytes = kMaxConfigJsonBytes);
// read_config_json, or nothing where the directory has no entry of that name. A dangling symbolic link or a loop is
// an entry: it is read, and refused by name, rather than taken for "no file".
std::optional<nlohmann::json> read_config_json_if_present(const std::filesystem::path& path,
                                                          uint64_t max_bytes = kMaxConfigJsonBytes);

// ---- outputs ----

// A file a command reads or writes, with what it is for messages: {"--input", "in.safetensors"}.
struct NamedPath {
  std::string role;
  std::filesystem::path path;
};

// Refuses, before any work, an output that cannot be written: its directory is missing or not a directory, or it is
// itself a directory.
void check_output_path(const NamedPath& output);
// Refuses an output that is the same file as an input or as another output, through symbolic links, hard links and
// relative paths alike.
void check_distinct(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs);

// Writes a file atomically: a temporary file in the same directory, flushed to disk and checked, then renamed over
// `path`; on any failure the old file is left as it was and mk::Error says why. A symbolic link is written through.
// A device or FIFO (/dev/null, /dev/stdout) has nothing to replace and is written in place, errors checked.
using FileWriter = std::function<void(std::ostream&)>;
void write_file(const std::filesystem::path& path, const FileWriter& write);
void write_file(const std::filesystem::path& path, std::string_view text);

}  // namespace mk
