// libFuzzer entry point for config parsing: any bytes read as config.json (the Hugging Face form) or as mk's own
// config form (mk_config.json, a schedule's header) must give a config within the engines' limits, or mk::Error.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "mk/check.h"
#include "mk/files.h"
#include "mk/model_config.h"

namespace {

// What a validated config promises to every engine: widths and products that fit what they address.
void check_promises(const mk::ModelConfig& config) {
  config.validate();
  if (config.d_model > mk::kMaxColumns || config.d_ff > mk::kMaxColumns || config.qkv_dim() > mk::kMaxColumns ||
      config.n_layers > mk::kMaxLayers || config.n_heads % config.n_kv_heads != 0 || !(config.rms_norm_eps > 0) ||
      config.rms_norm_eps > mk::kMaxRmsNormEps)
    std::abort();
  if (config.rope.type != mk::RopeType::kNone && !(config.rope.theta > mk::kMinRopeTheta)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json json;
  try {
    json = mk::parse_json({reinterpret_cast<const char*>(data), size}, "fuzz-config");
  } catch (const mk::Error&) {
    return 0;
  }
  try {
    check_promises(mk::model_config_from_hf_json(json, "fuzz-config"));
  } catch (const mk::Error&) {
  }
  try {
    const mk::ModelConfig config = mk::model_config_from_json(json, "fuzz-config");
    check_promises(config);
    // mk's own form round-trips exactly.
    if (!mk::first_difference(mk::model_config_from_json(mk::model_config_to_json(config), "again"), config).empty())
      std::abort();
  } catch (const mk::Error&) {
  }
  return 0;
}
