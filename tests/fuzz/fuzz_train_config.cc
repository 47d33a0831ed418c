// train/config.cc on an arbitrary --config file: apply_config_file then validate() give a configuration
// or a trident Error naming the key or the file; no other exception (a JSON type error escaping as
// nlohmann's own exception is a finding), no crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "fuzz_util.h"
#include "trident/core/error.h"
#include "trident/train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = trident::fuzz::scratch_dir() / "config.json";
  trident::fuzz::write_file(path, data, size);
  try {
    trident::train::TrainConfig cfg;
    trident::train::apply_config_file(cfg, path.string());
    cfg.validate();
    (void)cfg.to_json().dump();
  } catch (const trident::Error&) {
  }
  return 0;
}
