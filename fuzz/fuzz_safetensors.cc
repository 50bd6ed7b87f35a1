// libFuzzer entry point: any byte string must either parse into consistent tensors or throw mk::Error.
#include <cstdint>
#include <span>

#include "mk/check.h"
#include "mk/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    uint64_t data_offset = 0;
    const auto tensors = mk::parse_safetensors({data, size}, "fuzz-input", &data_offset);
    for (const mk::TensorInfo& tensor : tensors) {
      // The parser promises every tensor lies inside the file; touching its bytes lets ASan check the promise.
      if (tensor.data_end > tensor.data_begin) {
        volatile uint8_t last = data[data_offset + tensor.data_end - 1];
        (void)last;
      }
    }
  } catch (const mk::Error&) {
  }
  return 0;
}
