// The env table is the one place a TRIDENT_* variable's default lives: every declared default parses with
// the accessor that reads it, a set value wins over it, and a name the table does not declare is refused.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "harness/scoped_env.h"
#include "trident/core/env.h"
#include "trident/core/error.h"

namespace trident::env {
namespace {

using trident::testing::ScopedEnv;

TEST(Env, EveryDeclaredDefaultParsesWithItsAccessor) {
  for (const auto& p : all_params()) {
    ScopedEnv unset(p.name, nullptr);
    EXPECT_EQ(param_string(p.name), p.default_value) << p.name;
  }
  // The typed accessors read the table's defaults (none of them set here).
  ScopedEnv a("TRIDENT_TIMEOUT", nullptr), b("TRIDENT_SHM_RING_BYTES", nullptr), c("TRIDENT_CMA", nullptr),
      d("TRIDENT_TRANSPORT", nullptr), e("TRIDENT_BIND", nullptr), f("TRIDENT_MPI_CHECK", nullptr);
  EXPECT_EQ(timeout_seconds(), 600.0);
  EXPECT_EQ(shm_ring_bytes(), 0);
  EXPECT_TRUE(cma());
  EXPECT_EQ(transport(), "auto");
  EXPECT_EQ(bind(), "auto");
  EXPECT_FALSE(mpi_check());
}

TEST(Env, ASetValueWinsAndIsParsed) {
  ScopedEnv a("TRIDENT_TIMEOUT", "500ms"), b("TRIDENT_SHM_RING_BYTES", "64K"), c("TRIDENT_CMA", "off");
  EXPECT_DOUBLE_EQ(timeout_seconds(), 0.5);
  EXPECT_EQ(shm_ring_bytes(), 64 * 1024);
  EXPECT_FALSE(cma());
  ScopedEnv bad("TRIDENT_MPI_CHECK", "maybe");
  EXPECT_THROW(mpi_check(), InvalidArgument);
}

TEST(Env, SpinFollowsOversubscriptionUnlessForced) {
  {
    ScopedEnv unset("TRIDENT_SPIN", nullptr);
    EXPECT_FALSE(short_spin(false));
    EXPECT_TRUE(short_spin(true));
  }
  {
    ScopedEnv s("TRIDENT_SPIN", "short");
    EXPECT_TRUE(short_spin(false));
  }
  {
    ScopedEnv l("TRIDENT_SPIN", "long");
    EXPECT_FALSE(short_spin(true));
  }
  ScopedEnv bad("TRIDENT_SPIN", "sometimes");
  try {
    short_spin(false);
    FAIL() << "TRIDENT_SPIN=sometimes was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("TRIDENT_SPIN"), std::string::npos) << e.what();
  }
}

TEST(Env, AnUndeclaredNameIsRefused) {
  EXPECT_THROW(param_string("TRIDENT_NOT_DECLARED_ANYWHERE"), InvalidArgument);
  EXPECT_THROW(param_bool("TRIDENT_NOT_DECLARED_ANYWHERE"), InvalidArgument);
}

}  // namespace
}  // namespace trident::env
