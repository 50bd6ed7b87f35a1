// The parts of megakernel._core that module.cc registers from other files.
#pragma once

#include <nanobind/nanobind.h>

namespace mk::python {

// megakernel._core.Tokenizer and StreamDecoder (tokenizer_binding.cc).
void bind_tokenizer(nanobind::module_& m);

}  // namespace mk::python
