// Tests of the safetensors reader and writer: exact round trips, bf16 conversion, and every malformed-header error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "mk/check.h"
#include "mk/safetensors.h"
#include "test_util.h"

namespace {

using mk::testing_util::as_bytes;
using mk::testing_util::error_of;
using mk::testing_util::TempDir;

using ::testing::HasSubstr;

// A whole file: the 8-byte little-endian length, then `header`, then `data_size` data bytes.
std::vector<uint8_t> file_bytes(const std::string& header, size_t data_size, uint64_t claimed_header_size) {
  std::vector<uint8_t> bytes;
  bytes.reserve(8 + header.size() + data_size);
  for (int i = 0; i < 8; ++i) bytes.push_back(uint8_t(claimed_header_size >> (8 * i)));
  for (char c : header) bytes.push_back(uint8_t(c));
  for (size_t i = 0; i < data_size; ++i) bytes.push_back(uint8_t(i));
  return bytes;
}

std::vector<uint8_t> file_bytes(const std::string& header, size_t data_size) {
  return file_bytes(header, data_size, header.size());
}

std::string parse_error(const std::vector<uint8_t>& bytes) {
  return error_of([&] { mk::parse_safetensors(bytes, "bad.safetensors"); });
}

std::string parse_error(const std::string& header, size_t data_size) {
  return parse_error(file_bytes(header, data_size));
}

std::vector<uint16_t> bits_of(const std::vector<mk::bf16>& values) {
  std::vector<uint16_t> bits;
  for (mk::bf16 value : values) bits.push_back(value.bits);
  return bits;
}

// Writes the source words of (source bits, expected bf16 bits) pairs as one tensor of `dtype`, reads it back
// converted to bf16, and checks every element against its expected bits.
template <typename Word>
void expect_converted(const TempDir& dir, mk::DType dtype, const std::vector<std::pair<Word, uint16_t>>& cases) {
  std::vector<Word> words;
  std::vector<uint16_t> expected;
  for (auto [word, bf16] : cases) {
    words.push_back(word);
    expected.push_back(bf16);
  }
  const std::filesystem::path path = dir.path() / "converted.safetensors";
  mk::write_safetensors(path, {{"x", dtype, {int64_t(words.size())}, as_bytes(words)}});
  mk::SafetensorsFile file(path);
  EXPECT_EQ(bits_of(file.read_bf16(*file.find("x"))), expected);
}

}  // namespace

TEST(Safetensors, RoundTripsEveryFloatDtype) {
  TempDir dir;
  // Arbitrary bit patterns, NaN and infinity included: BF16 must come back untouched.
  const std::vector<uint16_t> bf16_bits = {0x0000, 0x8000, 0x3f80, 0xbf80, 0x7f80, 0xff80, 0x7fc1, 0x0001, 0x1234, 0xfedc};
  const std::vector<uint16_t> f16_bits = {0x3c00, 0xc000};
  const std::vector<float> f32_values = {1.0f, -1.5f, 0.0f};
  const std::vector<int32_t> i32_values = {7, -7};
  const std::vector<uint8_t> empty;
  const std::filesystem::path path = dir.path() / "all.safetensors";
  mk::write_safetensors(path, {{"b", mk::DType::kBF16, {2, 5}, as_bytes(bf16_bits)},
                               {"h", mk::DType::kF16, {2}, as_bytes(f16_bits)},
                               {"f", mk::DType::kF32, {1, 3}, as_bytes(f32_values)},
                               {"i", mk::DType::kI32, {2}, as_bytes(i32_values)},
                               {"e", mk::DType::kF32, {0, 4}, empty}});

  mk::SafetensorsFile file(path);
  EXPECT_EQ(file.path(), path.string());
  ASSERT_EQ(file.tensors().size(), 5u);  // __metadata__ is not a tensor
  for (size_t i = 1; i < file.tensors().size(); ++i)
    EXPECT_LE(file.tensors()[i - 1].data_begin, file.tensors()[i].data_begin) << "tensors sorted by offset";
  EXPECT_EQ(file.find("missing"), nullptr);

  const mk::TensorInfo* b = file.find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, mk::DType::kBF16);
  EXPECT_EQ(b->shape, (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(b->numel(), 10);
  EXPECT_EQ(bits_of(file.read_bf16(*b)), bf16_bits);

  const mk::TensorInfo* h = file.find("h");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(bits_of(file.read_bf16(*h)), (std::vector<uint16_t>{0x3f80, 0xc000}));

  const mk::TensorInfo* f = file.find("f");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->shape, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(bits_of(file.read_bf16(*f)), (std::vector<uint16_t>{0x3f80, 0xbfc0, 0x0000}));

  const mk::TensorInfo* i = file.find("i");
  ASSERT_NE(i, nullptr);
  std::span<const uint8_t> raw = file.bytes(*i);
  ASSERT_EQ(raw.size(), 8u);
  EXPECT_EQ(std::memcmp(raw.data(), i32_values.data(), 8), 0);

  const mk::TensorInfo* e = file.find("e");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->numel(), 0);
  EXPECT_TRUE(file.read_bf16(*e).empty());

  // The data section starts 8-byte aligned, as the format recommends.
  uint64_t data_offset = 0;
  std::ifstream stream(path, std::ios::binary);
  std::vector<uint8_t> whole((std::istreambuf_iterator<char>(stream)), std::istreambuf_iterator<char>());
  mk::parse_safetensors(whole, "x", &data_offset);
  EXPECT_EQ(data_offset % 8, 0u);
  EXPECT_EQ(whole.size(), data_offset + 20 + 4 + 12 + 8);
}

TEST(Safetensors, F16ConvertsExactlyIncludingSubnormals) {
  TempDir dir;
  // Expected bf16 bits worked out by hand: half -> float is exact, then float -> bf16 rounds to nearest even.
  const std::vector<std::pair<uint16_t, uint16_t>> cases = {
      {0x3c00, 0x3f80},  // 1.0
      {0xc000, 0xc000},  // -2.0
      {0x3555, 0x3eab},  // 0.333251953125 = 0x3eaaa000: the low half 0xa000 rounds up
      {0x0001, 0x3380},  // smallest subnormal 2^-24
      {0x03ff, 0x3880},  // largest subnormal 1023 * 2^-24 = 0x387fc000: rounds up to 2^-14
      {0x8200, 0xb800},  // negative subnormal -2^-15
      {0x8001, 0xb380},  // -2^-24
      {0x8000, 0x8000},  // -0.0 keeps its sign
      {0x7c00, 0x7f80},  // +inf
      {0xfbff, 0xc780},  // -65504 = 0xc77fe000: rounds up to -65536
  };
  expect_converted(dir, mk::DType::kF16, cases);

  // NaN stays NaN (the payload is not specified).
  const std::filesystem::path path = dir.path() / "nan.safetensors";
  const std::vector<uint16_t> nan = {0x7e00};
  mk::write_safetensors(path, {{"x", mk::DType::kF16, {1}, as_bytes(nan)}});
  mk::SafetensorsFile nan_file(path);
  EXPECT_TRUE(std::isnan(mk::to_float(nan_file.read_bf16(*nan_file.find("x"))[0])));
}

TEST(Safetensors, F32RoundsToNearestEven) {
  TempDir dir;
  const std::vector<std::pair<uint32_t, uint16_t>> cases = {
      {0x3f800000, 0x3f80},  // 1.0
      {0x3f808000, 0x3f80},  // exactly halfway, even neighbour below: down
      {0x3f818000, 0x3f82},  // exactly halfway, odd neighbour below: up to the even one
      {0x3f808001, 0x3f81},  // just above halfway: up
      {0x3f807fff, 0x3f80},  // just below halfway: down
      {0xbfc00000, 0xbfc0},  // -1.5
      {0xc0490fdb, 0xc049},  // -pi: low half 0x0fdb rounds down
      {0xbf80c000, 0xbf81},  // negative, above halfway: magnitude rounds up
      {0x7f7fffff, 0x7f80},  // FLT_MAX rounds to +inf
      {0x00000001, 0x0000},  // smallest float subnormal rounds to +0
      {0x80000000, 0x8000},  // -0.0
  };
  expect_converted(dir, mk::DType::kF32, cases);
}

TEST(Safetensors, ReadBf16RejectsIntegerDtypes) {
  TempDir dir;
  const std::vector<int32_t> values = {1, 2, 3};
  const std::filesystem::path path = dir.path() / "i32.safetensors";
  mk::write_safetensors(path, {{"ids", mk::DType::kI32, {3}, as_bytes(values)}});
  mk::SafetensorsFile file(path);
  const std::string message = error_of([&] { file.read_bf16(*file.find("ids")); });
  EXPECT_THAT(message, HasSubstr("supported"));
  EXPECT_THAT(message, HasSubstr("'ids'"));
  EXPECT_THAT(message, HasSubstr("I32"));
  EXPECT_THAT(message, HasSubstr(path.string()));
}

TEST(Safetensors, WriterRejectsInconsistentTensors) {
  TempDir dir;
  const std::vector<float> values = {1, 2, 3};
  const std::filesystem::path path = dir.path() / "w.safetensors";
  EXPECT_THAT(error_of([&] { mk::write_safetensors(path, {{"x", mk::DType::kF32, {2, 2}, as_bytes(values)}}); }),
              HasSubstr("'x' has 12 bytes for shape [2, 2]"));
  EXPECT_THAT(error_of([&] {
                mk::write_safetensors(path, {{"x", mk::DType::kF32, {3}, as_bytes(values)},
                                             {"x", mk::DType::kF32, {3}, as_bytes(values)}});
              }),
              HasSubstr("'x' written twice"));
}

TEST(Safetensors, FileErrorsNameThePath) {
  TempDir dir;
  const std::filesystem::path missing = dir.path() / "absent.safetensors";
  std::string message = error_of([&] { mk::SafetensorsFile file(missing); });
  EXPECT_THAT(message, HasSubstr(missing.string()));
  EXPECT_THAT(message, HasSubstr("cannot open"));

  EXPECT_THAT(error_of([&] { mk::SafetensorsFile file(dir.path()); }), HasSubstr("not a regular file"));

  const std::filesystem::path empty = dir.path() / "empty.safetensors";
  std::ofstream(empty).close();
  message = error_of([&] { mk::SafetensorsFile file(empty); });
  EXPECT_THAT(message, HasSubstr(empty.string()));
  EXPECT_THAT(message, HasSubstr("truncated"));
}

TEST(SafetensorsParse, AcceptsAMinimalFile) {
  const auto tensors = mk::parse_safetensors(
      file_bytes(R"({"__metadata__":{"k":"v"},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},)"
                 R"("a":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})",
                 6),
      "ok");
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_EQ(tensors[0].name, "a");  // sorted by offset, not by name or header order
  EXPECT_TRUE(tensors[0].shape.empty());
  EXPECT_EQ(tensors[0].numel(), 1);  // a scalar
  EXPECT_EQ(tensors[1].name, "b");
  EXPECT_EQ(tensors[1].data_begin, 4u);
  EXPECT_EQ(tensors[1].data_end, 6u);
  EXPECT_TRUE(mk::parse_safetensors(file_bytes("{}", 0), "empty header").empty());
}

TEST(SafetensorsParse, ShorterThanTheLengthPrefix) {
  const std::string message = parse_error(std::vector<uint8_t>{1, 0, 0});
  EXPECT_THAT(message, HasSubstr("bad.safetensors"));
  EXPECT_THAT(message, HasSubstr("truncated safetensors file (3 bytes"));
  EXPECT_THAT(parse_error(std::vector<uint8_t>{}), HasSubstr("truncated"));
}

TEST(SafetensorsParse, HeaderLongerThanTheFile) {
  const std::string message = parse_error(file_bytes("{}", 0, 3));
  EXPECT_THAT(message, HasSubstr("bad.safetensors"));
  EXPECT_THAT(message, HasSubstr("truncated safetensors header: it claims 3 bytes, the file has 2"));
  // Lengths near 2^64 must not wrap around the bounds check.
  EXPECT_THAT(parse_error(file_bytes("{}", 0, ~uint64_t{0})), HasSubstr("larger than"));
}

TEST(SafetensorsParse, HeaderOverTheSizeLimit) {
  // The limit applies before the file is read any further, so no 100 MB buffer is needed.
  const std::string message = parse_error(file_bytes("{}", 0, mk::kMaxSafetensorsHeaderBytes + 1));
  EXPECT_THAT(message, HasSubstr("bad.safetensors"));
  EXPECT_THAT(message, HasSubstr("larger than the 100000000 allowed"));
}

TEST(SafetensorsParse, HeaderNotJson) {
  for (const std::string& header : {std::string("{\"a\": "), std::string("not json"), std::string("\0\0", 2)}) {
    const std::string message = parse_error(header, 0);
    EXPECT_THAT(message, HasSubstr("bad.safetensors"));
    EXPECT_THAT(message, HasSubstr("not valid JSON"));
  }
}

TEST(SafetensorsParse, HeaderNotAnObject) {
  for (const char* header : {"[1, 2]", "42", "\"text\"", "null"}) {
    const std::string message = parse_error(header, 0);
    EXPECT_THAT(message, HasSubstr("bad.safetensors"));
    EXPECT_THAT(message, HasSubstr("must be a JSON object")) << header;
  }
  EXPECT_THAT(parse_error(R"({"t": [1]})", 0), HasSubstr("tensor 't': expected an object"));
}

TEST(SafetensorsParse, UnknownDtype) {
  const std::string message = parse_error(R"({"t":{"dtype":"F7","shape":[1],"data_offsets":[0,1]}})", 1);
  EXPECT_THAT(message, HasSubstr("bad.safetensors: tensor 't'"));
  EXPECT_THAT(message, HasSubstr("unknown dtype 'F7'"));
  // Dtype names are case-sensitive in the format.
  EXPECT_THAT(parse_error(R"({"t":{"dtype":"bf16","shape":[1],"data_offsets":[0,2]}})", 2),
              HasSubstr("unknown dtype 'bf16'"));
}

TEST(SafetensorsParse, ShapeDisagreesWithOffsets) {
  const std::string message = parse_error(R"({"t":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,10]}})", 16);
  EXPECT_THAT(message, HasSubstr("bad.safetensors: tensor 't'"));
  EXPECT_THAT(message, HasSubstr("shape [2, 3] of BF16 needs 12 bytes but data_offsets [0, 10] hold 10"));
  // A shape whose byte count overflows 64 bits must not wrap around to a small number.
  EXPECT_THAT(parse_error(R"({"t":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0),
              HasSubstr("shape is too large"));
  EXPECT_THAT(parse_error(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
              HasSubstr("tensor 't' shape: expected a non-negative integer, got -1"));
  EXPECT_THAT(parse_error(R"({"t":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4),
              HasSubstr("expected a non-negative integer"));
}

TEST(SafetensorsParse, OffsetsOutsideTheDataSection) {
  const std::string message = parse_error(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 8);
  EXPECT_THAT(message, HasSubstr("bad.safetensors: tensor 't'"));
  EXPECT_THAT(message, HasSubstr("data_offsets [4, 12] lie outside the 8-byte data section"));
  EXPECT_THAT(message, HasSubstr("truncated"));  // the usual cause: a download cut short
  EXPECT_THAT(parse_error(R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[9,9]}})", 8), HasSubstr("outside"));
  EXPECT_THAT(parse_error(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551615,0]}})", 8),
              HasSubstr("reversed"));
}

TEST(SafetensorsParse, ReversedOffsets) {
  const std::string message = parse_error(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8);
  EXPECT_THAT(message, HasSubstr("bad.safetensors: tensor 't'"));
  EXPECT_THAT(message, HasSubstr("data_offsets [8, 4] are reversed"));
}

TEST(SafetensorsParse, OverlappingTensors) {
  const std::string message = parse_error(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      12);
  EXPECT_THAT(message, HasSubstr("bad.safetensors"));
  EXPECT_THAT(message, HasSubstr("tensors 'a' [0, 8] and 'b' [4, 12] overlap"));
  // Two tensors on the very same bytes.
  EXPECT_THAT(parse_error(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                          R"("b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                          4),
              HasSubstr("overlap"));
}

TEST(SafetensorsParse, OverlapHiddenBehindAnEmptyTensor) {
  // Regression: only neighbours in offset order were compared and empty tensors were skipped, so an empty tensor
  // sorted between two overlapping ones hid the overlap.
  const std::string message =
      parse_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                  R"("c":{"dtype":"F32","shape":[2],"data_offsets":[6,14]}})",
                  16);
  EXPECT_THAT(message, HasSubstr("'a' [0, 8] and 'c' [6, 14] overlap"));
  // A long tensor overlapping a later one past a short one in between.
  EXPECT_THAT(parse_error(R"({"a":{"dtype":"U8","shape":[10],"data_offsets":[0,10]},)"
                          R"("b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},)"
                          R"("c":{"dtype":"U8","shape":[2],"data_offsets":[8,10]}})",
                          10),
              HasSubstr("overlap"));
  // Empty tensors themselves may sit anywhere in range, even inside another tensor.
  EXPECT_EQ(mk::parse_safetensors(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                             R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                                             R"("c":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                             16),
                                  "ok")
                .size(),
            3u);
}

TEST(SafetensorsParse, NegativeOffsets) {
  const std::string message = parse_error(R"({"t":{"dtype":"U8","shape":[4],"data_offsets":[-4,0]}})", 8);
  EXPECT_THAT(message, HasSubstr("bad.safetensors: tensor 't' data_offsets"));
  EXPECT_THAT(message, HasSubstr("expected a non-negative integer, got -4"));
  EXPECT_THAT(parse_error(R"({"t":{"dtype":"U8","shape":[4],"data_offsets":[0,"4"]}})", 8),
              HasSubstr("expected a non-negative integer"));
}

TEST(SafetensorsParse, MissingFields) {
  EXPECT_THAT(parse_error(R"({"t":{"shape":[1],"data_offsets":[0,1]}})", 1),
              HasSubstr("bad.safetensors: tensor 't': missing string field 'dtype'"));
  EXPECT_THAT(parse_error(R"({"t":{"dtype":1,"shape":[1],"data_offsets":[0,1]}})", 1),
              HasSubstr("missing string field 'dtype'"));
  EXPECT_THAT(parse_error(R"({"t":{"dtype":"U8","data_offsets":[0,1]}})", 1),
              HasSubstr("bad.safetensors: tensor 't': missing array field 'shape'"));
  EXPECT_THAT(parse_error(R"({"t":{"dtype":"U8","shape":[1]}})", 1),
              HasSubstr("bad.safetensors: tensor 't': 'data_offsets' must be an array of two offsets"));
  EXPECT_THAT(parse_error(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", 2),
              HasSubstr("'data_offsets' must be an array of two offsets"));
}

TEST(SafetensorsParse, FuzzSeedCorpusParsesAsItsNamesSay) {
  // The fuzzer's seed files are named valid-* or invalid-*: keep them honest, so that the corpus starts the fuzzer
  // on both sides of every check.
  const std::filesystem::path corpus = std::filesystem::path(__FILE__).parent_path() / ".." / ".." / "fuzz" / "corpus";
  ASSERT_TRUE(std::filesystem::is_directory(corpus)) << corpus;
  int valid = 0, invalid = 0;
  for (const auto& entry : std::filesystem::directory_iterator(corpus)) {
    const std::string name = entry.path().filename().string();
    std::ifstream stream(entry.path(), std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(stream)), std::istreambuf_iterator<char>());
    if (name.starts_with("valid-")) {
      ++valid;
      EXPECT_NO_THROW(mk::parse_safetensors(bytes, name)) << name;
    } else if (name.starts_with("invalid-")) {
      ++invalid;
      EXPECT_THAT(error_of([&] { mk::parse_safetensors(bytes, name); }), HasSubstr(name));
    }
  }
  EXPECT_GE(valid, 2);
  EXPECT_GE(invalid, 2);
}
