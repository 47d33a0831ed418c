// Skip policy for every test. A test skips only for what the machine cannot change, and says why:
//   TRIDENT_SKIP_MACHINE(reason)  no GPU visible, no privilege for network namespaces, a CPU feature.
//   TRIDENT_SKIP_MISSING(reason)  a package or tool is missing (scripts/deps.sh build installs it): a skip
//                                 on a developer's machine, a failure under CI=true, so that an
//                                 independent reference (PyTorch, numpy, mpirun) cannot silently drop out.
// scripts/test.sh lists every skipped test with its reason at the end of a run.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace trident::testing {

// CI=true (or 1) in the environment: .ci/run and most CI systems set it.
inline bool in_ci() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && (std::string(ci) == "true" || std::string(ci) == "1");
}

}  // namespace trident::testing

#define TRIDENT_SKIP_MACHINE(reason) GTEST_SKIP() << "machine: " << (reason)

#define TRIDENT_SKIP_MISSING(reason)                                                                   \
  do {                                                                                                 \
    if (::trident::testing::in_ci())                                                                   \
      GTEST_FAIL() << "CI=true and a dependency is missing (scripts/deps.sh build installs it): "      \
                   << (reason);                                                                        \
    GTEST_SKIP() << "missing: " << (reason);                                                           \
  } while (0)
