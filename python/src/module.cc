// megakernel._core: the nanobind module behind the Python package. Arrays cross as DLPack/NumPy ndarrays, mk::Error
// becomes megakernel.MkError; the typed, documented API is the Python package's (python/megakernel/).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <exception>
#include <nlohmann/json.hpp>
#include <utility>

#include "bindings.h"
#include "core_model.h"
#include "mk/check.h"
#include "mk/gpu.h"
#include "mk/program.h"

namespace nb = nanobind;

namespace mk::python {

namespace {

using HostArray = nb::ndarray<nb::device::cpu, nb::c_contig, nb::ro>;
using DeviceArray = nb::ndarray<nb::device::cuda, nb::c_contig>;

bool is_dtype(const nb::dlpack::dtype& dtype, nb::dlpack::dtype_code code, int bits) {
  return dtype.code == uint8_t(code) && dtype.bits == bits && dtype.lanes == 1;
}

std::string dtype_name(const nb::dlpack::dtype& dtype) {
  const char* kinds[] = {"int", "uint", "float", "?", "bfloat", "complex", "bool"};
  return fmt::format("{}{}", dtype.code < 7 ? kinds[dtype.code] : "?", dtype.bits);
}

template <typename Array>
std::vector<int64_t> dims_of(const Array& array) {
  std::vector<int64_t> dims;
  for (size_t d = 0; d < array.ndim(); ++d) dims.push_back(int64_t(array.shape(d)));
  return dims;
}

// The model's input from host memory: int32/int64 token ids, or float32 hidden states.
ref::ModelInput host_input(const ModelConfig& config, const HostArray& array) {
  const RunShape shape = input_shape(config, dims_of(array));
  const auto dtype = array.dtype();
  if (config.has_embedding) {
    if (is_dtype(dtype, nb::dlpack::dtype_code::Int, 32))
      return token_input(config, shape, static_cast<const int32_t*>(array.data()));
    MK_CHECK(is_dtype(dtype, nb::dlpack::dtype_code::Int, 64), "token ids must be int32 or int64, got {}",
             dtype_name(dtype));
    return token_input(config, shape, static_cast<const int64_t*>(array.data()));
  }
  MK_CHECK(is_dtype(dtype, nb::dlpack::dtype_code::Float, 32), "hidden states must be float32 here, got {}",
           dtype_name(dtype));
  return hidden_input(config, shape, static_cast<const float*>(array.data()));
}

// (batch, seq_len, N) float32, owning the matrix's storage (no copy).
nb::ndarray<nb::numpy, float> to_numpy(ref::Matrix matrix, const RunShape& shape) {
  auto* storage = new std::vector<float>(std::move(matrix.data));
  nb::capsule owner(storage, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  return {storage->data(), {size_t(shape.batch), size_t(shape.seq_len), size_t(matrix.cols)}, owner};
}

// The gpu engine on device tensors: input int32 ids (batch, seq) or bf16 hidden (batch, seq, d_model), output bf16
// (batch, seq, N), both contiguous on the engine's GPU.
void forward_device(CoreModel& model, const DeviceArray& input, DeviceArray& output) {
  const ModelConfig& config = model.config();
  const RunShape shape = input_shape(config, dims_of(input));
  const bool ids = is_dtype(input.dtype(), nb::dlpack::dtype_code::Int, 32);
  const bool bf16 = is_dtype(input.dtype(), nb::dlpack::dtype_code::Bfloat, 16);
  MK_CHECK(config.has_embedding ? ids : bf16, "gpu engine: the device input must be {}, got {}",
           config.has_embedding ? "int32 token ids" : "bfloat16 hidden states", dtype_name(input.dtype()));
  const std::vector<int64_t> expected = {shape.batch, shape.seq_len, output_cols(config)};
  MK_CHECK(dims_of(output) == expected && is_dtype(output.dtype(), nb::dlpack::dtype_code::Bfloat, 16),
           "gpu engine: the output must be bfloat16 of shape ({}), got {} of shape ({})", fmt::join(expected, ", "),
           dtype_name(output.dtype()), fmt::join(dims_of(output), ", "));
  const void* in = input.data();
  void* out = output.data();
  nb::gil_scoped_release release;
  model.forward_device(shape, in, out);
}

// A generation as Python's generate() and check_generate() give it.
GenerateRequest request_of(const std::string& engine, std::vector<std::vector<int64_t>> prompts, int64_t max_new_tokens,
                           const ref::SamplingParams& sampling, std::optional<std::vector<int64_t>> eos_ids,
                           int64_t max_context) {
  GenerationOptions options;
  options.max_new_tokens = max_new_tokens;
  return {.engine = engine,
          .prompts = std::move(prompts),
          .eos_ids = std::move(eos_ids),
          .options = std::move(options),
          .sampling = sampling,
          .max_context = max_context};
}

// Generation with the GIL released; on_step (step, new ids with -1 for stopped sequences) is called with it held,
// and whatever it raises ends the generation and reaches the caller. Returns (new ids, stop reason) per sequence.
std::vector<std::pair<std::vector<int32_t>, std::string>> generate(CoreModel& model, GenerateRequest request,
                                                                   nb::object on_step) {
  StepCallback callback;
  if (!on_step.is_none()) {
    callback = [&on_step](int64_t step, const std::vector<int32_t>& made) {
      nb::gil_scoped_acquire acquire;
      on_step(step, made);
    };
  }
  GenerationResult result;
  {
    nb::gil_scoped_release release;
    result = model.generate(request, callback);
  }
  std::vector<std::pair<std::vector<int32_t>, std::string>> out;
  for (const SequenceResult& sequence : result.sequences) {
    out.emplace_back(std::vector<int32_t>(sequence.tokens.begin() + sequence.prompt_length, sequence.tokens.end()),
                     stop_reason_text(sequence.stop));
  }
  return out;
}

nb::dict gpu_info() {
  const GpuInfo info = query_gpu();
  nb::dict result;
  result["usable"] = info.usable;
  result["reason"] = info.reason;
  result["name"] = info.name;
  result["sm_count"] = info.sm_count;
  result["compute_capability"] = std::make_pair(info.compute_major, info.compute_minor);
  result["memory_bytes"] = info.memory_bytes;
  return result;
}

nb::list preset_list() {
  nb::list result;
  for (const Preset& preset : presets()) {
    nb::dict entry;
    entry["name"] = preset.config.name;
    entry["description"] = preset.description;
    entry["batch"] = preset.shape.batch;
    entry["seq_len"] = preset.shape.seq_len;
    result.append(entry);
  }
  return result;
}

void bind_model(nb::module_& m) {
  nb::class_<ref::SamplingParams>(m, "SamplingParams")
      .def(nb::init<>())
      .def_rw("temperature", &ref::SamplingParams::temperature)
      .def_rw("top_k", &ref::SamplingParams::top_k)
      .def_rw("top_p", &ref::SamplingParams::top_p)
      .def_rw("seed", &ref::SamplingParams::seed);
  nb::class_<CoreModel>(m, "Model")
      .def_static("from_dir", &CoreModel::from_dir, nb::arg("dir"), nb::call_guard<nb::gil_scoped_release>())
      .def_static(
          "from_preset",
          [](const std::string& name, uint64_t seed, int64_t layers, int64_t d_model, int64_t heads, int64_t kv_heads,
             int64_t d_ff) {
            return CoreModel::from_preset(name, seed, {layers, d_model, heads, kv_heads, d_ff});
          },
          nb::arg("name"), nb::arg("seed"), nb::arg("layers"), nb::arg("d_model"), nb::arg("heads"),
          nb::arg("kv_heads"), nb::arg("d_ff"), nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("source", &CoreModel::source)
      .def_prop_ro("default_shape",
                   [](const CoreModel& model) {
                     return std::make_pair(model.default_shape().batch, model.default_shape().seq_len);
                   })
      .def_prop_ro("output_cols", [](const CoreModel& model) { return output_cols(model.config()); })
      .def_prop_ro("tokenizer", &CoreModel::tokenizer, nb::rv_policy::reference_internal)
      .def("config_json", [](const CoreModel& model) { return model_config_to_json(model.config()).dump(); })
      .def(
          "info_json",
          [](const CoreModel& model, int64_t batch, int64_t seq_len) {
            MK_CHECK(batch > 0 && seq_len > 0, "batch ({}) and seq_len ({}) must be positive", batch, seq_len);
            return forward_info_json(model.config(), {batch, seq_len}).dump();
          },
          nb::arg("batch"), nb::arg("seq_len"))
      .def(
          "input_shape",
          [](const CoreModel& model, const std::vector<int64_t>& dims) {
            const RunShape shape = input_shape(model.config(), dims);
            return std::make_pair(shape.batch, shape.seq_len);
          },
          nb::arg("dims"))
      .def(
          "forward",
          [](CoreModel& model, const std::string& engine, const HostArray& array) {
            const EngineKind kind = resolve_engine(engine);
            const ref::ModelInput input = host_input(model.config(), array);
            ref::Matrix output;
            {
              nb::gil_scoped_release release;
              output = model.forward(kind, input);
            }
            return to_numpy(std::move(output), input.shape);
          },
          nb::arg("engine"), nb::arg("input"))
      .def("forward_device", &forward_device, nb::arg("input"), nb::arg("output"))
      .def(
          "trace",
          [](CoreModel& model, const std::string& engine, const HostArray& array, const std::filesystem::path& path) {
            const EngineKind kind = resolve_engine(engine == "auto" ? (query_gpu().usable ? "gpu" : "cpu-vm") : engine);
            const ref::ModelInput input = host_input(model.config(), array);
            nb::gil_scoped_release release;
            return model.trace(kind, input, path);
          },
          nb::arg("engine"), nb::arg("input"), nb::arg("path"))
      .def_prop_ro("eos_ids", &CoreModel::eos_ids)
      .def_prop_ro("load_warning", &CoreModel::load_warning)
      .def(
          "generate",
          [](CoreModel& model, const std::string& engine, std::vector<std::vector<int64_t>> prompts,
             int64_t max_new_tokens, const ref::SamplingParams& sampling,
             std::optional<std::vector<int64_t>> eos_ids, int64_t max_context, nb::object on_step) {
            return generate(model, request_of(engine, std::move(prompts), max_new_tokens, sampling, std::move(eos_ids),
                                              max_context),
                            std::move(on_step));
          },
          nb::arg("engine"), nb::arg("prompts"), nb::arg("max_new_tokens"), nb::arg("sampling"),
          nb::arg("eos_ids").none(), nb::arg("max_context"), nb::arg("on_step").none())
      .def(
          "check_generate",
          [](const CoreModel& model, const std::string& engine, std::vector<std::vector<int64_t>> prompts,
             int64_t max_new_tokens, const ref::SamplingParams& sampling,
             std::optional<std::vector<int64_t>> eos_ids, int64_t max_context) {
            const GenerateRequest request =
                request_of(engine, std::move(prompts), max_new_tokens, sampling, std::move(eos_ids), max_context);
            nb::gil_scoped_release release;
            model.check_generate(request);
          },
          nb::arg("engine"), nb::arg("prompts"), nb::arg("max_new_tokens"), nb::arg("sampling"),
          nb::arg("eos_ids").none(), nb::arg("max_context"))
      // Without the GIL: it waits for the model's mutex, which a generation holds while its callback takes the GIL.
      .def("clear_engines", &CoreModel::clear_engines, nb::call_guard<nb::gil_scoped_release>());
}

}  // namespace

}  // namespace mk::python

NB_MODULE(_core, m) {
  using namespace mk::python;
  m.doc() = "megakernel's C++ core; use the megakernel package, not this module";
  const nb::exception<mk::Error> mk_error(m, "MkError", PyExc_RuntimeError);
  // Registered after nb::exception's own translator, so tried first: a message carries names and text from the
  // caller's files, escaped as the CLI escapes them, so that an ESC cannot steer the terminal and a NUL (which would
  // end the C string) is shown rather than cutting the message short.
  nb::register_exception_translator(
      [](const std::exception_ptr& thrown, void* type) {
        try {
          std::rethrow_exception(thrown);
        } catch (const mk::Error& error) {
          PyErr_SetString(static_cast<PyObject*>(type), mk::printable(error.what()).c_str());
        }
      },
      mk_error.ptr());
  m.def(
      "resolve_engine", [](const std::string& name) { return std::string(engine_name(resolve_engine(name))); },
      nb::arg("name"));
  m.def("gpu_info", &gpu_info);
  m.def("presets", &preset_list);
  bind_tokenizer(m);
  bind_model(m);
}
