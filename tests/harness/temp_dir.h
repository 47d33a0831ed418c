// Small test helpers shared by the unit tests: a fresh temporary folder removed at scope exit, and
// EXPECT_CONTAINS for error messages.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace trident::testing {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag = "test") {
    static int n = 0;
    path = std::filesystem::temp_directory_path() / fmt::format("trident-{}-{}-{}", tag, ::getpid(), n++);
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace trident::testing

#define EXPECT_CONTAINS(hay, needle) EXPECT_NE(std::string(hay).find(needle), std::string::npos) << (hay)
