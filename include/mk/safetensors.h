// Safetensors: a validating, memory-mapped reader and a writer (https://github.com/huggingface/safetensors format).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mk/bf16.h"

namespace mk {

enum class DType { kBool, kU8, kI8, kI16, kU16, kF16, kBF16, kI32, kU32, kF32, kF64, kI64, kU64, kF8E4M3, kF8E5M2 };

std::string_view dtype_name(DType dtype);  // as written in the header, e.g. "BF16"
int64_t dtype_size(DType dtype);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  uint64_t data_begin = 0;  // byte offsets into the data section, which starts right after the header
  uint64_t data_end = 0;
  int64_t numel() const;
};

// The largest header we accept; the reference implementation uses the same bound.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Parses and validates the header of a whole safetensors file given as bytes. Throws mk::Error naming `source`
// and the problem: truncated or oversized header, bad JSON, nesting deeper than 16 levels, unknown dtype, a tensor
// name or field given twice, shape/offset mismatch, offsets outside the file, overlapping tensors. Memory grows
// with the tensors, not with the header's size. Returns the tensors sorted by data offset.
std::vector<TensorInfo> parse_safetensors(std::span<const uint8_t> file_bytes, const std::string& source,
                                          uint64_t* data_section_offset = nullptr);

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);  // maps the file read-only and validates it
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(std::string_view name) const;  // nullptr when absent
  std::span<const uint8_t> bytes(const TensorInfo& tensor) const;
  // Converts BF16, F16 or F32 data to bf16 (round to nearest even); other dtypes are an error.
  std::vector<bf16> read_bf16(const TensorInfo& tensor) const;

 private:
  std::string path_;
  const uint8_t* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  uint64_t data_offset_ = 0;
  std::vector<TensorInfo> tensors_;
  std::vector<uint32_t> by_name_;  // indices into tensors_, sorted by name
};

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;
};

void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors);

}  // namespace mk
