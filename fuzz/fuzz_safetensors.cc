// libFuzzer entry point: any byte string must either parse into consistent tensors or throw mk::Error.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "mk/check.h"
#include "mk/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    uint64_t data_offset = 0;
    const auto tensors = mk::parse_safetensors({data, size}, "fuzz-input", &data_offset);
    if (data_offset < 8 || data_offset > size) std::abort();
    const uint64_t data_size = size - data_offset;
    // What the parser promises about an accepted file; a broken promise is a crash for libFuzzer to keep.
    uint64_t previous_begin = 0;
    uint64_t end_so_far = 0;  // the largest end of the non-empty tensors seen so far
    for (const mk::TensorInfo& tensor : tensors) {
      if (tensor.data_begin > tensor.data_end || tensor.data_end > data_size) std::abort();
      if (tensor.data_begin < previous_begin) std::abort();  // sorted by offset
      previous_begin = tensor.data_begin;
      if (uint64_t(tensor.numel()) * uint64_t(mk::dtype_size(tensor.dtype)) != tensor.data_end - tensor.data_begin)
        std::abort();
      if (tensor.data_end > tensor.data_begin) {
        if (tensor.data_begin < end_so_far) std::abort();  // overlap
        end_so_far = tensor.data_end;
        // The tensor lies inside the file: touching its last byte lets ASan check that too.
        volatile uint8_t last = data[data_offset + tensor.data_end - 1];
        (void)last;
      }
    }
  } catch (const mk::Error&) {
  }
  return 0;
}
