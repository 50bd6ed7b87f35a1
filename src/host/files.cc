// Input files (regular, bounded), JSON without duplicate keys or deep nesting, a model directory's config files, and
// outputs written atomically.
#include "mk/files.h"

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>

#include "mk/check.h"
#include "mk/limits.h"

namespace mk {

namespace fs = std::filesystem;

namespace {

// What a non-regular file is, for the message that refuses it.
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}

// What an open's errno hides: a loop of links, or a link whose target is gone (as a Hugging Face cache snapshot's
// link is once its blob was pruned), which "No such file" alone would misname as a missing file.
std::string open_error_hint(const fs::path& path, int error) {
  if (error == ELOOP) return " (a loop of symbolic links?)";
  std::error_code ignored;
  if (error != ENOENT || !fs::is_symlink(fs::symlink_status(path, ignored))) return "";
  const fs::path target = fs::read_symlink(path, ignored);
  return fmt::format(" (a symbolic link to '{}', which does not exist)", target.string());
}

}  // namespace

InputFile::InputFile(const fs::path& path) : path_(path.string()) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever; it is refused below.
  fd_ = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) {
    const int error = errno;
    throw Error(fmt::format("{}: cannot open: {}{}", path_, std::strerror(error), open_error_hint(path, error)));
  }
  struct stat status {};
  const bool stat_ok = ::fstat(fd_, &status) == 0;
  const int stat_errno = errno;
  if (!stat_ok || !S_ISREG(status.st_mode)) {
    ::close(fd_);
    throw Error(stat_ok ? fmt::format("{}: is {}, not a regular file", path_, kind_of(status.st_mode))
                        : fmt::format("{}: cannot stat: {}", path_, std::strerror(stat_errno)));
  }
  size_ = uint64_t(status.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read_at(uint64_t offset, std::span<uint8_t> out) const {
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t count = ::pread(fd_, out.data() + done, out.size() - done, off_t(offset + done));
    if (count < 0 && errno == EINTR) continue;
    MK_CHECK(count >= 0, "{}: read failed: {}", path_, std::strerror(errno));
    MK_CHECK(count > 0, "{}: ends after {} bytes, sooner than its size said (changed while being read?)", path_,
             offset + done);
    done += size_t(count);
  }
}

std::string read_file(const fs::path& path, uint64_t max_bytes) {
  const InputFile file(path);
  MK_CHECK(file.size() <= max_bytes, "{}: {} bytes, more than the {} allowed for this file", path.string(), file.size(),
           max_bytes);
  std::string text(size_t(file.size()), '\0');
  file.read_at(0, {reinterpret_cast<uint8_t*>(text.data()), text.size()});
  return text;
}

nlohmann::json parse_json(std::string_view text, const std::string& source) {
  std::vector<std::set<std::string>> keys;  // of each object being read
  const nlohmann::json::parser_callback_t check = [&](int depth, nlohmann::json::parse_event_t event,
                                                      nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start || event == Event::array_start) {
      MK_CHECK(depth < kMaxJsonDepth, "{}: JSON nested deeper than {} levels", source, kMaxJsonDepth);
      if (event == Event::object_start) keys.emplace_back();
    } else if (event == Event::key) {
      const std::string& key = parsed.get_ref<const std::string&>();
      MK_CHECK(keys.back().insert(key).second, "{}: key '{}' appears twice in one object", source, printable(key));
    } else if (event == Event::object_end) {
      keys.pop_back();
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), check);
  } catch (const nlohmann::json::exception& error) {
    throw Error(fmt::format("{}: not valid JSON: {}", source, printable(error.what())));
  }
}

nlohmann::json read_json_file(const fs::path& path, uint64_t max_bytes) {
  return parse_json(read_file(path, max_bytes), path.string());
}

std::optional<int64_t> json_to_int64(const nlohmann::json& value) {
  if (value.is_number_unsigned()) {
    const uint64_t number = value.get<uint64_t>();
    if (number > uint64_t(INT64_MAX)) return std::nullopt;
    return int64_t(number);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {
    const double number = value.get<double>();
    if (std::isfinite(number) && std::trunc(number) == number && std::fabs(number) < 0x1p62) return int64_t(number);
  }
  return std::nullopt;
}

std::optional<double> json_to_double(const nlohmann::json& value) {
  if (!value.is_number()) return std::nullopt;
  const double number = value.get<double>();
  if (!std::isfinite(number)) return std::nullopt;
  return number;
}

std::string json_excerpt(const nlohmann::json& value) {
  constexpr size_t kMaxChars = 80;
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > kMaxChars) text = text.substr(0, kMaxChars) + "...";
  return printable(text);
}

std::vector<int32_t> json_token_ids(const nlohmann::json& value, const std::string& what) {
  std::vector<int32_t> ids;
  if (value.is_null()) return ids;
  for (const nlohmann::json& id : value.is_array() ? value : nlohmann::json::array({value})) {
    const std::optional<int64_t> number = id.is_number_integer() ? json_to_int64(id) : std::nullopt;
    MK_CHECK(number && *number >= 0 && *number <= INT32_MAX,
             "{} must be a token id (a whole number in [0, 2^31)) or a list of them, got {}", what,
             json_excerpt(value));
    ids.push_back(int32_t(*number));
  }
  return ids;
}

bool has_entry(const fs::path& path) {
  std::error_code error;
  return fs::symlink_status(path, error).type() != fs::file_type::not_found;
}

// ---- a model directory's JSON config files ----

nlohmann::json read_config_json(const fs::path& path, uint64_t max_bytes) {
  nlohmann::json json = read_json_file(path, max_bytes);
  MK_CHECK(json.is_object(), "{}: expected a JSON object, got {}", path.string(), json_excerpt(json));
  return json;
}

std::optional<nlohmann::json> read_config_json_if_present(const fs::path& path, uint64_t max_bytes) {
  if (!has_entry(path)) return std::nullopt;
  return read_config_json(path, max_bytes);
}

// ---- outputs ----

namespace {

bool exists_as_other_than_regular(const fs::path& path) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  return fs::exists(status) && !fs::is_regular_file(status);
}

bool same_file(const fs::path& a, const fs::path& b) {
  std::error_code error;
  if (fs::exists(a, error) && fs::exists(b, error)) {
    const bool equivalent = fs::equivalent(a, b, error);
    if (!error) return equivalent;
  }
  // Not both there yet: compare where they would be, with links of their existing parts resolved.
  const fs::path canonical_a = fs::weakly_canonical(a, error);
  if (error) return false;
  const fs::path canonical_b = fs::weakly_canonical(b, error);
  return !error && canonical_a == canonical_b;
}

}  // namespace

void check_output_path(const NamedPath& output) {
  const std::string shown = fmt::format("{} {}", output.role, output.path.string());
  std::error_code error;
  MK_CHECK(!fs::is_directory(output.path, error), "{}: is a directory; give a file name", shown);
  if (exists_as_other_than_regular(output.path)) return;  // a device or FIFO: written in place
  const fs::path directory = output.path.has_parent_path() ? output.path.parent_path() : fs::path(".");
  const fs::file_status status = fs::status(directory, error);
  MK_CHECK(fs::exists(status), "{}: directory {} does not exist", shown, directory.string());
  MK_CHECK(fs::is_directory(status), "{}: {} is not a directory", shown, directory.string());
  MK_CHECK(::access(directory.c_str(), W_OK) == 0, "{}: directory {} is not writable: {}", shown, directory.string(),
           std::strerror(errno));
}

void check_distinct(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const NamedPath& out = outputs[i];
    for (const NamedPath& in : inputs) {
      MK_CHECK(!same_file(out.path, in.path), "{} {} is the same file as {} ({}): refusing to overwrite an input",
               out.role, out.path.string(), in.role, in.path.string());
    }
    if (exists_as_other_than_regular(out.path)) continue;  // /dev/null may take several outputs
    for (size_t j = i + 1; j < outputs.size(); ++j) {
      MK_CHECK(!same_file(out.path, outputs[j].path),
               "{} {} and {} {} are the same file: one would overwrite the other", out.role, out.path.string(),
               outputs[j].role, outputs[j].path.string());
    }
  }
}

namespace {

// Runs `write` into `file_path` and checks that every byte reached the file; errors name `shown`.
void write_stream(const fs::path& file_path, const FileWriter& write, const std::string& shown) {
  std::ofstream file(file_path, std::ios::binary | std::ios::trunc);
  MK_CHECK(file.is_open(), "{}: cannot open for writing: {}", shown, std::strerror(errno));
  errno = 0;
  write(file);
  file.flush();
  const int flush_errno = errno;
  const bool written = file.good();
  file.close();
  MK_CHECK(written && !file.fail(), "{}: write failed{}", shown,
           flush_errno != 0 ? fmt::format(": {}", std::strerror(flush_errno)) : "");
}

void sync_to_disk(const fs::path& path, const std::string& shown) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MK_CHECK(fd >= 0, "{}: cannot reopen to flush: {}", shown, std::strerror(errno));
  const int result = ::fsync(fd);
  const int sync_errno = errno;
  ::close(fd);
  MK_CHECK(result == 0, "{}: flushing to disk failed: {}", shown, std::strerror(sync_errno));
}

}  // namespace

void write_file(const fs::path& path, const FileWriter& write) {
  const std::string shown = path.string();
  std::error_code error;
  fs::path target = path;
  if (fs::is_symlink(fs::symlink_status(path, error))) {
    target = fs::weakly_canonical(path, error);
    MK_CHECK(!error, "{}: cannot follow the symbolic link: {}", shown, error.message());
  }
  if (exists_as_other_than_regular(target)) {
    MK_CHECK(!fs::is_directory(target, error), "{}: is a directory", shown);
    write_stream(target, write, shown);  // nothing to replace atomically
    return;
  }
  const fs::path directory = target.has_parent_path() ? target.parent_path() : fs::path(".");
  MK_CHECK(fs::is_directory(directory, error), "{}: directory {} does not exist", shown, directory.string());
  static std::atomic<uint64_t> serial{0};
  const fs::path temp =
      directory / fmt::format(".{}.tmp-{}-{}", target.filename().string(), ::getpid(), serial.fetch_add(1));
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  MK_CHECK(fd >= 0, "{}: cannot create a file in {}: {}", shown, directory.string(), std::strerror(errno));
  struct stat old {};
  if (::stat(target.c_str(), &old) == 0) ::fchmod(fd, old.st_mode & 07777);  // replacing keeps the permissions
  ::close(fd);
  try {
    write_stream(temp, write, shown);
    sync_to_disk(temp, shown);
    MK_CHECK(::rename(temp.c_str(), target.c_str()) == 0, "{}: cannot replace: {}", shown, std::strerror(errno));
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
}

void write_file(const fs::path& path, std::string_view text) {
  write_file(path, [&](std::ostream& out) { out.write(text.data(), std::streamsize(text.size())); });
}

}  // namespace mk
