// train/checkpoint.cc load_checkpoint on a folder whose checkpoint.json holds arbitrary bytes (and whose
// model.safetensors, when the JSON lists it, is a small valid file): a loaded checkpoint or a trident
// Error; no other exception, no crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz_util.h"
#include "trident/core/error.h"
#include "trident/train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto dir = trident::fuzz::scratch_dir() / "ckpt-00000001";
  static const bool made = [&] {
    std::filesystem::create_directories(dir);
    // {"w":F32 [1]} = 1.0f: what a checkpoint.json seed can point at (bytes 80, checksum in the seeds).
    const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
    std::string file(8, '\0');
    for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
    file += header;
    const float one = 1.0f;
    file.append(reinterpret_cast<const char*>(&one), 4);
    trident::fuzz::write_file(dir / "model.safetensors", reinterpret_cast<const uint8_t*>(file.data()), file.size());
    return true;
  }();
  (void)made;
  trident::fuzz::write_file(dir / "checkpoint.json", data, size);
  try {
    trident::train::LoadedCheckpoint c = trident::train::load_checkpoint(dir.string(), true);
    if (c.weights.empty()) std::abort();  // a loaded checkpoint has weights
  } catch (const trident::Error&) {
  }
  return 0;
}
