// Shared by the fuzz targets: a scratch file per process for parsers that read from a path, and the rule
// every target checks: bad bytes end in a trident::Error (a clear message) and nothing else.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace trident::fuzz {

// A folder of this process under $TMPDIR (or /tmp), created once.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* t = std::getenv("TMPDIR");
    std::filesystem::path d = std::filesystem::path(t && *t ? t : "/tmp") / ("trident-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline void write_file(const std::filesystem::path& p, const uint8_t* data, size_t size) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

}  // namespace trident::fuzz
