// cuBLAS is opened on first use (cuda/cublas_api.h), not at process start. These checks need the library,
// not a GPU, so they run on every machine that builds the CUDA layer.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

#include "harness/skip.h"
#include "trident/cuda/cublas_api.h"

namespace trident::cuda {
namespace {

// What `cmd` prints on stdout and stderr together.
std::string output_of(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  pclose(p);
  return out;
}

TEST(CublasApi, ACommandThatRunsNoGpuGemmNeverLoadsIt) {
  // A test binary copied away from its build tree (to run on a GPU machine) has no trident beside it.
  if (!std::filesystem::exists(TRIDENT_BIN))
    TRIDENT_SKIP_MISSING(std::string("the trident binary of this build at ") + TRIDENT_BIN);
  // The dynamic loader lists every library it opens under LD_DEBUG=files.
  const std::string log = output_of(std::string("LD_DEBUG=files ") + TRIDENT_BIN + " --version");
  ASSERT_NE(log.find("file=libfmt"), std::string::npos) << "LD_DEBUG listed no library: " << log;
  EXPECT_EQ(log.find("libcublas"), std::string::npos) << "`trident --version` loaded cuBLAS:\n" << log;
}

TEST(CublasApi, OpensOnFirstUseAndNamesStatuses) {
  const auto candidates = cublas_library_candidates();
  ASSERT_EQ(candidates.size(), 2u);
  EXPECT_EQ(candidates[0].front(), '/') << candidates[0];
  EXPECT_NE(candidates[0].find(candidates[1]), std::string::npos) << candidates[0] << " / " << candidates[1];
  const CublasApi& api = cublas();
  EXPECT_EQ(&api, &cublas()) << "opened twice";
  EXPECT_STREQ(api.status_name(CUBLAS_STATUS_NOT_INITIALIZED), "CUBLAS_STATUS_NOT_INITIALIZED");
  EXPECT_NE(std::string(api.status_string(CUBLAS_STATUS_INVALID_VALUE)), "");
  EXPECT_NE(api.create, nullptr);
  EXPECT_NE(api.set_math_mode, nullptr);
  EXPECT_NE(api.set_stream, nullptr);
  EXPECT_NE(api.sgemm, nullptr);
  EXPECT_NE(api.gemm_ex, nullptr);
  // cuBLASLt (GEMMs with an epilogue) opens the same way, from the library cuBLAS loads.
  const auto lt_candidates = cublas_lt_library_candidates();
  ASSERT_EQ(lt_candidates.size(), 2u);
  EXPECT_NE(lt_candidates[1].find("libcublasLt.so."), std::string::npos) << lt_candidates[1];
  const CublasLtApi& lt = cublas_lt();
  EXPECT_EQ(&lt, &cublas_lt()) << "opened twice";
  for (const void* f : {reinterpret_cast<const void*>(lt.create), reinterpret_cast<const void*>(lt.matmul),
                        reinterpret_cast<const void*>(lt.heuristic), reinterpret_cast<const void*>(lt.layout_create),
                        reinterpret_cast<const void*>(lt.preference_set)})
    EXPECT_NE(f, nullptr);
}

}  // namespace
}  // namespace trident::cuda
