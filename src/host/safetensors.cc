// Safetensors reader (mmap + strict header validation) and writer.
#include "mk/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>

#include "mk/check.h"

namespace mk {

namespace {

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  int64_t size;
};

constexpr DTypeEntry kDTypes[] = {
    {DType::kBool, "BOOL", 1}, {DType::kU8, "U8", 1},   {DType::kI8, "I8", 1},     {DType::kI16, "I16", 2},
    {DType::kU16, "U16", 2},   {DType::kF16, "F16", 2}, {DType::kBF16, "BF16", 2}, {DType::kI32, "I32", 4},
    {DType::kU32, "U32", 4},   {DType::kF32, "F32", 4}, {DType::kF64, "F64", 8},   {DType::kI64, "I64", 8},
    {DType::kU64, "U64", 8},   {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1},
};

const DTypeEntry& entry(DType dtype) {
  for (const DTypeEntry& e : kDTypes)
    if (e.dtype == dtype) return e;
  throw Error("internal error: unknown DType");
}

uint64_t read_le64(const uint8_t* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = value << 8 | bytes[i];
  return value;
}

uint64_t json_offset(const nlohmann::json& value, const std::string& where) {
  MK_CHECK(value.is_number_unsigned() || (value.is_number_integer() && value.get<int64_t>() >= 0),
           "{}: expected a non-negative integer, got {}", where, value.dump());
  return value.get<uint64_t>();
}

}  // namespace

std::string_view dtype_name(DType dtype) { return entry(dtype).name; }
int64_t dtype_size(DType dtype) { return entry(dtype).size; }

int64_t TensorInfo::numel() const {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

std::vector<TensorInfo> parse_safetensors(std::span<const uint8_t> file_bytes, const std::string& source,
                                          uint64_t* data_section_offset) {
  MK_CHECK(file_bytes.size() >= 8, "{}: truncated safetensors file ({} bytes, the header length alone takes 8)",
           source, file_bytes.size());
  const uint64_t header_size = read_le64(file_bytes.data());
  MK_CHECK(header_size <= kMaxSafetensorsHeaderBytes, "{}: safetensors header of {} bytes is larger than the {} allowed",
           source, header_size, kMaxSafetensorsHeaderBytes);
  MK_CHECK(header_size <= file_bytes.size() - 8, "{}: truncated safetensors header: it claims {} bytes, the file has {}",
           source, header_size, file_bytes.size() - 8);
  const uint64_t data_offset = 8 + header_size;
  const uint64_t data_size = file_bytes.size() - data_offset;
  if (data_section_offset != nullptr) *data_section_offset = data_offset;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(file_bytes.begin() + 8, file_bytes.begin() + int64_t(data_offset));
  } catch (const nlohmann::json::exception& error) {
    throw Error(fmt::format("{}: safetensors header is not valid JSON: {}", source, error.what()));
  }
  MK_CHECK(header.is_object(), "{}: safetensors header must be a JSON object", source);

  std::vector<TensorInfo> tensors;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = fmt::format("{}: tensor '{}'", source, name);
    MK_CHECK(value.is_object(), "{}: expected an object", where);
    MK_CHECK(value.contains("dtype") && value["dtype"].is_string(), "{}: missing string field 'dtype'", where);
    MK_CHECK(value.contains("shape") && value["shape"].is_array(), "{}: missing array field 'shape'", where);
    MK_CHECK(value.contains("data_offsets") && value["data_offsets"].is_array() && value["data_offsets"].size() == 2,
             "{}: 'data_offsets' must be an array of two offsets", where);
    TensorInfo tensor;
    tensor.name = name;
    const std::string dtype = value["dtype"].get<std::string>();
    auto found = std::find_if(std::begin(kDTypes), std::end(kDTypes), [&](const DTypeEntry& e) { return e.name == dtype; });
    MK_CHECK(found != std::end(kDTypes), "{}: unknown dtype '{}'", where, dtype);
    tensor.dtype = found->dtype;
    uint64_t numel = 1;
    for (const nlohmann::json& dim : value["shape"]) {
      uint64_t extent = json_offset(dim, where + " shape");
      MK_CHECK(extent == 0 || numel <= std::numeric_limits<int64_t>::max() / 8 / extent,
               "{}: shape is too large", where);
      numel *= extent;
      tensor.shape.push_back(int64_t(extent));
    }
    tensor.data_begin = json_offset(value["data_offsets"][0], where + " data_offsets");
    tensor.data_end = json_offset(value["data_offsets"][1], where + " data_offsets");
    MK_CHECK(tensor.data_begin <= tensor.data_end, "{}: data_offsets [{}, {}] are reversed", where, tensor.data_begin,
             tensor.data_end);
    // A download cut short lands here rather than in the header checks, so the message says so.
    MK_CHECK(tensor.data_end <= data_size,
             "{}: data_offsets [{}, {}] lie outside the {}-byte data section (truncated file?)", where,
             tensor.data_begin, tensor.data_end, data_size);
    const uint64_t expected_bytes = numel * uint64_t(found->size);
    MK_CHECK(tensor.data_end - tensor.data_begin == expected_bytes,
             "{}: shape [{}] of {} needs {} bytes but data_offsets [{}, {}] hold {}", where,
             fmt::join(tensor.shape, ", "), dtype, expected_bytes, tensor.data_begin, tensor.data_end,
             tensor.data_end - tensor.data_begin);
    tensors.push_back(std::move(tensor));
  }
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.data_begin, a.data_end) < std::tie(b.data_begin, b.data_end);
  });
  // Empty tensors occupy no bytes and cannot overlap anything, so each non-empty tensor is compared with the last
  // non-empty one before it (comparing plain neighbours let an empty tensor in between hide an overlap).
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& current : tensors) {
    if (current.data_begin == current.data_end) continue;
    MK_CHECK(previous == nullptr || current.data_begin >= previous->data_end,
             "{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", source, previous->name, previous->data_begin,
             previous->data_end, current.name, current.data_begin, current.data_end);
    previous = &current;
  }
  return tensors;
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path.string()) {
  int fd = ::open(path_.c_str(), O_RDONLY);
  MK_CHECK(fd >= 0, "{}: cannot open: {}", path_, std::strerror(errno));
  struct stat status {};
  if (::fstat(fd, &status) != 0 || !S_ISREG(status.st_mode)) {
    ::close(fd);
    throw Error(fmt::format("{}: not a regular file", path_));
  }
  mapping_size_ = size_t(status.st_size);
  if (mapping_size_ > 0) {
    void* mapping = ::mmap(nullptr, mapping_size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int mmap_errno = errno;
    ::close(fd);
    MK_CHECK(mapping != MAP_FAILED, "{}: mmap failed: {}", path_, std::strerror(mmap_errno));
    mapping_ = static_cast<const uint8_t*>(mapping);
  } else {
    ::close(fd);
  }
  try {
    tensors_ = parse_safetensors({mapping_, mapping_size_}, path_, &data_offset_);
  } catch (...) {
    if (mapping_ != nullptr) ::munmap(const_cast<uint8_t*>(mapping_), mapping_size_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(const_cast<uint8_t*>(mapping_), mapping_size_);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  for (const TensorInfo& tensor : tensors_)
    if (tensor.name == name) return &tensor;
  return nullptr;
}

std::span<const uint8_t> SafetensorsFile::bytes(const TensorInfo& tensor) const {
  return {mapping_ + data_offset_ + tensor.data_begin, size_t(tensor.data_end - tensor.data_begin)};
}

std::vector<bf16> SafetensorsFile::read_bf16(const TensorInfo& tensor) const {
  std::span<const uint8_t> raw = bytes(tensor);
  const size_t count = size_t(tensor.numel());
  std::vector<bf16> values(count);
  switch (tensor.dtype) {
    case DType::kBF16:
      std::memcpy(values.data(), raw.data(), raw.size());
      break;
    case DType::kF16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t half;
        std::memcpy(&half, raw.data() + 2 * i, 2);
        values[i] = to_bf16(half_to_float(half));
      }
      break;
    case DType::kF32:
      for (size_t i = 0; i < count; ++i) {
        float value;
        std::memcpy(&value, raw.data() + 4 * i, 4);
        values[i] = to_bf16(value);
      }
      break;
    default:
      throw Error(fmt::format("{}: tensor '{}' has dtype {}; only BF16, F16 and F32 are supported", path_, tensor.name,
                              dtype_name(tensor.dtype)));
  }
  return values;
}

void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  std::set<std::string> names;
  for (const TensorToWrite& tensor : tensors) {
    MK_CHECK(names.insert(tensor.name).second, "{}: tensor '{}' written twice", path.string(), tensor.name);
    int64_t numel = 1;
    for (int64_t dim : tensor.shape) numel *= dim;
    MK_CHECK(uint64_t(numel * dtype_size(tensor.dtype)) == tensor.bytes.size(),
             "{}: tensor '{}' has {} bytes for shape [{}]", path.string(), tensor.name, tensor.bytes.size(),
             fmt::join(tensor.shape, ", "));
    header[tensor.name] = {{"dtype", dtype_name(tensor.dtype)},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + tensor.bytes.size()}}};
    offset += tensor.bytes.size();
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  std::ofstream file(path, std::ios::binary);
  MK_CHECK(file.good(), "{}: cannot create", path.string());
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  file.write(reinterpret_cast<const char*>(length), 8);
  file.write(text.data(), std::streamsize(text.size()));
  for (const TensorToWrite& tensor : tensors)
    file.write(reinterpret_cast<const char*>(tensor.bytes.data()), std::streamsize(tensor.bytes.size()));
  MK_CHECK(file.good(), "{}: write failed", path.string());
}

}  // namespace mk
