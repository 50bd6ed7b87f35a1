// Safetensors reader (mmap + strict header validation) and writer.
#include "mk/safetensors.h"

#include <sys/mman.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include "mk/check.h"
#include "mk/files.h"
#include "mk/limits.h"

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

// Reads the header with nlohmann's SAX interface and keeps nothing of the JSON but the tensors: a hostile header
// costs memory in proportion to its tensors, never to its nesting, its arrays or its metadata (a DOM of a 98 MB
// nested header took 3.65 GB). Containers are counted by depth: 1 is the header object, 2 a tensor's object, 3 its
// shape or data_offsets array; values of __metadata__ and of unknown fields are skipped, containers and all.
class HeaderReader final : public nlohmann::json_sax<nlohmann::json> {
 public:
  static constexpr int kMaxDepth = 16;

  HeaderReader(const std::string& source, uint64_t data_size) : source_(source), data_size_(data_size) {}
  std::vector<TensorInfo> tensors;

  bool null() override { return scalar("null"); }
  bool boolean(bool value) override { return scalar(value ? "true" : "false"); }
  bool number_integer(number_integer_t value) override {
    return value >= 0 ? number_unsigned(number_unsigned_t(value)) : scalar(std::to_string(value));
  }
  bool number_unsigned(number_unsigned_t value) override {
    if (skip_ > 0 || depth_ != 3) return scalar(std::to_string(value));
    std::vector<uint64_t>& values = field_ == Field::kShape ? extents_ : offsets_;
    MK_CHECK(field_ == Field::kShape || values.size() < 2, "{}: 'data_offsets' must be an array of two offsets",
             where());
    values.push_back(value);
    return true;
  }
  bool number_float(number_float_t, const string_t& text) override { return scalar(text); }
  bool string(string_t& value) override {
    if (skip_ == 0 && depth_ == 2 && field_ == Field::kDtype) {
      dtype_ = value;
      seen_ |= Field::kDtype;
      return true;
    }
    return scalar(fmt::format("\"{}\"", printable(value)));
  }
  bool binary(binary_t&) override { return scalar("binary data"); }
  bool start_object(std::size_t) override { return start_container(true); }
  bool start_array(std::size_t) override { return start_container(false); }
  bool end_object() override { return end_container(); }
  bool end_array() override { return end_container(); }
  bool key(string_t& name) override {
    if (skip_ > 0) return true;
    if (depth_ == 1) {
      name_ = name;
      MK_CHECK(!is_metadata() || !metadata_seen_, "{}: '__metadata__' appears twice in the header", source_);
      metadata_seen_ = metadata_seen_ || is_metadata();
      return true;
    }
    field_ = name == "dtype"          ? Field::kDtype
             : name == "shape"        ? Field::kShape
             : name == "data_offsets" ? Field::kOffsets
                                      : Field::kOther;
    MK_CHECK(tensor_keys_.insert(name).second, "{}: field '{}' appears twice", where(), printable(name));
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::json::exception& error) override {
    throw Error(fmt::format("{}: safetensors header is not valid JSON: {}", source_, printable(error.what())));
  }

 private:
  enum Field : unsigned { kNone = 0, kDtype = 1, kShape = 2, kOffsets = 4, kOther = 8 };

  std::string where() const { return fmt::format("{}: tensor '{}'", source_, printable(name_)); }
  bool is_metadata() const { return name_ == "__metadata__"; }

  // A value that is not a container.
  bool scalar(const std::string& text) {
    if (skip_ > 0) return true;
    MK_CHECK(depth_ != 0, "{}: safetensors header must be a JSON object", source_);
    if (depth_ == 1) {
      MK_CHECK(is_metadata(), "{}: expected an object", where());
    } else if (depth_ == 2) {
      wrong_field_type();
    } else {
      throw Error(fmt::format("{} {}: expected a non-negative integer, got {}", where(),
                              field_ == Field::kShape ? "shape" : "data_offsets", text));
    }
    return true;
  }

  void wrong_field_type() const {
    MK_CHECK(field_ != Field::kDtype, "{}: missing string field 'dtype'", where());
    MK_CHECK(field_ != Field::kShape, "{}: missing array field 'shape'", where());
    MK_CHECK(field_ != Field::kOffsets, "{}: 'data_offsets' must be an array of two offsets", where());
  }

  bool start_container(bool is_object) {
    MK_CHECK(depth_ + skip_ < kMaxDepth, "{}: safetensors header nested deeper than {} levels", source_, kMaxDepth);
    if (skip_ > 0 || (depth_ == 1 && is_metadata()) || (depth_ == 2 && field_ == Field::kOther)) {
      ++skip_;
    } else if (depth_ == 0) {
      MK_CHECK(is_object, "{}: safetensors header must be a JSON object", source_);
      depth_ = 1;
    } else if (depth_ == 1) {
      MK_CHECK(is_object, "{}: expected an object", where());
      begin_tensor();
    } else if (depth_ == 2) {
      if (is_object) wrong_field_type();
      MK_CHECK(field_ != Field::kDtype, "{}: missing string field 'dtype'", where());
      (field_ == Field::kShape ? extents_ : offsets_).clear();
      seen_ |= field_;
      depth_ = 3;
    } else {
      scalar(is_object ? "an object" : "an array");
    }
    return true;
  }

  bool end_container() {
    if (skip_ > 0) {
      --skip_;
    } else if (depth_ == 3) {
      MK_CHECK(field_ == Field::kShape || offsets_.size() == 2, "{}: 'data_offsets' must be an array of two offsets",
               where());
      depth_ = 2;
    } else if (depth_ == 2) {
      end_tensor();
      depth_ = 1;
    } else {
      depth_ = 0;
    }
    return true;
  }

  void begin_tensor() {
    depth_ = 2;
    seen_ = Field::kNone;
    field_ = Field::kNone;
    tensor_keys_.clear();
  }

  void end_tensor();

  const std::string& source_;
  const uint64_t data_size_;
  int depth_ = 0;
  int skip_ = 0;
  std::string name_;  // of the tensor being read
  bool metadata_seen_ = false;
  Field field_ = Field::kNone;
  unsigned seen_ = Field::kNone;
  std::set<std::string> tensor_keys_;
  std::string dtype_;
  std::vector<uint64_t> extents_, offsets_;
};

void HeaderReader::end_tensor() {
  MK_CHECK(seen_ & Field::kDtype, "{}: missing string field 'dtype'", where());
  MK_CHECK(seen_ & Field::kShape, "{}: missing array field 'shape'", where());
  MK_CHECK(seen_ & Field::kOffsets, "{}: 'data_offsets' must be an array of two offsets", where());
  TensorInfo tensor;
  tensor.name = name_;
  auto found =
      std::find_if(std::begin(kDTypes), std::end(kDTypes), [&](const DTypeEntry& e) { return e.name == dtype_; });
  MK_CHECK(found != std::end(kDTypes), "{}: unknown dtype '{}'", where(), printable(dtype_));
  tensor.dtype = found->dtype;
  // Every extent alone fits int64 with room for the dtype size: a zero extent must not let a 2^63 one through.
  constexpr uint64_t kMaxElements = uint64_t(std::numeric_limits<int64_t>::max()) / 8;
  uint64_t numel = 1;
  for (uint64_t extent : extents_) {
    MK_CHECK(extent <= kMaxElements && (extent == 0 || numel <= kMaxElements / extent), "{}: shape is too large",
             where());
    numel *= extent;
    tensor.shape.push_back(int64_t(extent));
  }
  tensor.data_begin = offsets_[0];
  tensor.data_end = offsets_[1];
  MK_CHECK(tensor.data_begin <= tensor.data_end, "{}: data_offsets [{}, {}] are reversed", where(), tensor.data_begin,
           tensor.data_end);
  // A download cut short lands here rather than in the header checks, so the message says so.
  MK_CHECK(tensor.data_end <= data_size_,
           "{}: data_offsets [{}, {}] lie outside the {}-byte data section (truncated file?)", where(),
           tensor.data_begin, tensor.data_end, data_size_);
  const uint64_t expected_bytes = numel * uint64_t(found->size);
  MK_CHECK(tensor.data_end - tensor.data_begin == expected_bytes,
           "{}: shape [{}] of {} needs {} bytes but data_offsets [{}, {}] hold {}", where(),
           fmt::join(tensor.shape, ", "), dtype_, expected_bytes, tensor.data_begin, tensor.data_end,
           tensor.data_end - tensor.data_begin);
  tensors.push_back(std::move(tensor));
}

// A name given twice would otherwise resolve to one of the two silently.
void check_unique_names(const std::vector<TensorInfo>& tensors, const std::string& source) {
  std::vector<const std::string*> names;
  names.reserve(tensors.size());
  for (const TensorInfo& tensor : tensors) names.push_back(&tensor.name);
  std::sort(names.begin(), names.end(), [](const std::string* a, const std::string* b) { return *a < *b; });
  for (size_t i = 1; i < names.size(); ++i)
    MK_CHECK(*names[i] != *names[i - 1], "{}: tensor '{}' appears twice in the header", source, printable(*names[i]));
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

  HeaderReader reader(source, data_size);
  nlohmann::json::sax_parse(file_bytes.begin() + 8, file_bytes.begin() + int64_t(data_offset), &reader);
  std::vector<TensorInfo> tensors = std::move(reader.tensors);
  check_unique_names(tensors, source);
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.data_begin, a.data_end) < std::tie(b.data_begin, b.data_end);
  });
  // Empty tensors occupy no bytes and cannot overlap anything, so each non-empty tensor is compared with the last
  // non-empty one before it (comparing plain neighbours let an empty tensor in between hide an overlap).
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& current : tensors) {
    if (current.data_begin == current.data_end) continue;
    MK_CHECK(previous == nullptr || current.data_begin >= previous->data_end,
             "{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", source, printable(previous->name),
             previous->data_begin, previous->data_end, printable(current.name), current.data_begin, current.data_end);
    previous = &current;
  }
  return tensors;
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path.string()) {
  {
    const InputFile file(path);  // refuses a FIFO, device or directory without blocking on it
    mapping_size_ = size_t(file.size());
    if (mapping_size_ > 0) {
      void* mapping = ::mmap(nullptr, mapping_size_, PROT_READ, MAP_PRIVATE, file.fd(), 0);
      MK_CHECK(mapping != MAP_FAILED, "{}: mmap failed: {}", path_, std::strerror(errno));
      mapping_ = static_cast<const uint8_t*>(mapping);
    }
  }
  try {
    tensors_ = parse_safetensors({mapping_, mapping_size_}, path_, &data_offset_);
  } catch (...) {
    if (mapping_ != nullptr) ::munmap(const_cast<uint8_t*>(mapping_), mapping_size_);
    throw;
  }
  by_name_.resize(tensors_.size());
  for (uint32_t i = 0; i < by_name_.size(); ++i) by_name_[i] = i;
  std::sort(by_name_.begin(), by_name_.end(),
            [&](uint32_t a, uint32_t b) { return tensors_[a].name < tensors_[b].name; });
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(const_cast<uint8_t*>(mapping_), mapping_size_);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  // By binary search: a file of a million tensors must not make each lookup of a model's few hundred a scan.
  auto found = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                                [&](uint32_t index, std::string_view key) { return tensors_[index].name < key; });
  return found != by_name_.end() && tensors_[*found].name == name ? &tensors_[*found] : nullptr;
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
    MK_CHECK(names.insert(tensor.name).second, "{}: tensor '{}' written twice", path.string(), printable(tensor.name));
    int64_t bytes = dtype_size(tensor.dtype);
    for (int64_t dim : tensor.shape) bytes = checked_mul(bytes, dim, "tensor bytes");
    MK_CHECK(uint64_t(bytes) == tensor.bytes.size(), "{}: tensor '{}' has {} bytes for shape [{}]", path.string(),
             printable(tensor.name), tensor.bytes.size(), fmt::join(tensor.shape, ", "));
    header[tensor.name] = {{"dtype", dtype_name(tensor.dtype)},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + tensor.bytes.size()}}};
    offset += tensor.bytes.size();
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  write_file(path, [&](std::ostream& file) {
    uint8_t length[8];
    for (int i = 0; i < 8; ++i) length[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
    file.write(reinterpret_cast<const char*>(length), 8);
    file.write(text.data(), std::streamsize(text.size()));
    for (const TensorToWrite& tensor : tensors)
      file.write(reinterpret_cast<const char*>(tensor.bytes.data()), std::streamsize(tensor.bytes.size()));
  });
}

}  // namespace mk
