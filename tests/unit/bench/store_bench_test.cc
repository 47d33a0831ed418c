// `trident bench store`'s library: 256 clients (threads in 4 processes) rendezvous through one TCPStore
// beside connections that stall half-way through a request and ones that vanish half-way through a wait;
// every client finishes, reads back another's key correctly, and neither counter loses an increment.
// Bad options are refused by name.
#include <gtest/gtest.h>

#include "trident/bench/store_bench.h"
#include "trident/core/error.h"

namespace trident::bench {
namespace {

TEST(StoreBench, ManyClientsRendezvousBesideStalledAndVanishingConnections) {
  StoreBenchOptions o;
  o.clients = 256;
  o.procs = 4;
  o.stalled = 3;
  o.vanishing = 3;
  o.timeout = Seconds(20.0);  // a stalled server shows as clients past this deadline
  const StoreBenchResult r = run_store_bench(o);
  EXPECT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.arrived, 256);
  EXPECT_EQ(r.departed, 256);
  EXPECT_EQ(r.keys, 256 + 4);  // one per client, two counters, two release keys
  EXPECT_GT(r.rendezvous_max_s, 0.0);
}

TEST(StoreBench, BadOptionsAreRefusedByName) {
  StoreBenchOptions o;
  o.clients = 0;
  try {
    run_store_bench(o);
    FAIL() << "0 clients accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--clients"), std::string::npos) << e.what();
  }
  o.clients = 4;
  o.procs = 5;
  try {
    run_store_bench(o);
    FAIL() << "more processes than clients accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--procs"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trident::bench
