// megakernel._core.Tokenizer and StreamDecoder: mk::Tokenizer (tokenizer.json) as it is, strings as UTF-8.
#include <nanobind/nanobind.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "mk/tokenizer.h"

namespace nb = nanobind;

namespace mk::python {

void bind_tokenizer(nb::module_& m) {
  nb::class_<StreamDecoder>(m, "StreamDecoder")
      .def("push", &StreamDecoder::push, nb::arg("id"))
      .def("finish", &StreamDecoder::finish);

  nb::class_<Tokenizer>(m, "Tokenizer")
      .def_static("load", &Tokenizer::load, nb::arg("path"))
      .def_static("from_json", &Tokenizer::from_json, nb::arg("json_text"), nb::arg("origin") = "tokenizer.json")
      .def(
          "encode",
          [](const Tokenizer& tokenizer, std::string_view text, bool add_special_tokens, bool split_special_tokens) {
            nb::gil_scoped_release release;
            return tokenizer.encode(
                text, {.add_special_tokens = add_special_tokens, .split_special_tokens = split_special_tokens});
          },
          nb::arg("text"), nb::arg("add_special_tokens"), nb::arg("split_special_tokens"))
      .def(
          "decode",
          [](const Tokenizer& tokenizer, const std::vector<int32_t>& ids, bool skip_special_tokens) {
            nb::gil_scoped_release release;
            return tokenizer.decode(ids, skip_special_tokens);
          },
          nb::arg("ids"), nb::arg("skip_special_tokens"))
      // The decoder refers to its tokenizer: keep the tokenizer alive as long as the decoder.
      .def("stream_decoder", &Tokenizer::stream_decoder, nb::arg("skip_special_tokens"), nb::keep_alive<0, 1>())
      .def_prop_ro("vocab_size", &Tokenizer::vocab_size)
      .def_prop_ro("bos_id", &Tokenizer::bos_id)
      .def_prop_ro("eos_ids", &Tokenizer::eos_ids)
      .def("token_to_id", &Tokenizer::token_to_id, nb::arg("token"))
      .def("id_to_token", &Tokenizer::id_to_token, nb::arg("id"))
      .def("is_special", &Tokenizer::is_special, nb::arg("id"))
      .def_prop_ro("special_tokens",
                   [](const Tokenizer& tokenizer) {
                     nb::dict result;
                     for (const AddedToken& token : tokenizer.added_tokens())
                       if (token.special) result[nb::str(token.content.c_str())] = token.id;
                     return result;
                   })
      .def_static("unicode_version", &Tokenizer::unicode_version);
}

}  // namespace mk::python
