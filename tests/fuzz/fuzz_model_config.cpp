// libFuzzer target: ModelConfig::from_json_text on arbitrary text. Must return a config that
// passes validate() or a Status, never crash; an accepted config's derived sizes must not overflow.
#include <cstddef>
#include <cstdint>
#include <string>

#include "format/model_config.h"
#include "format/weight_table.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace oscar::format;
  std::string text(reinterpret_cast<const char*>(data), size);
  oscar::Result<ModelConfig> config = ModelConfig::from_json_text(text);
  if (!config.ok()) return 0;
  volatile int64_t sink = config->n_params() + config->kv_bytes_per_token_bf16();
  (void)sink;
  if (config->n_layers <= 64) (void)weight_specs(config.value());
  return 0;
}
