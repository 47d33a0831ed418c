// train/checkpoint.cc read_safetensors on arbitrary file contents: a tensor map or an IoError naming the
// file and what is wrong; no other exception, no crash, no out-of-bounds read.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

#include "fuzz_util.h"
#include "trident/core/error.h"
#include "trident/train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = trident::fuzz::scratch_dir() / "model.safetensors";
  trident::fuzz::write_file(path, data, size);
  try {
    std::map<std::string, std::string> metadata;
    auto tensors = trident::train::read_safetensors(path.string(), &metadata);
    for (const auto& [name, t] : tensors) {
      size_t n = 1;
      for (auto d : t.shape) n *= static_cast<size_t>(d);
      if (n != t.data.size()) std::abort();
    }
  } catch (const trident::Error& e) {
    if (std::string(e.what()).find(path.string()) == std::string::npos) std::abort();  // names the file
  }
  return 0;
}
