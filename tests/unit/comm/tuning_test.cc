// Measured algorithm selection (comm/tuning.h): the file round-trips, predictions interpolate as the
// header says (checked against values computed by hand), a bad file is an error naming the file and the
// fault, a group follows a hand-written file, and `trident bench comm --tune` writes a file the backend
// reads and uses.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "harness/cli_run.h"
#include "harness/multiproc.h"
#include "trident/comm/algorithms/algorithm.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/hash_store.h"
#include "trident/comm/store/store.h"
#include "trident/comm/tuning.h"
#include "trident/core/error.h"

namespace trident::tuning_test {
namespace {

std::string temp_file(const std::string& stem) {
  return ::testing::TempDir() + "/trident_tuning_" + stem + "_" + std::to_string(::getpid()) + ".json";
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

// Sets TRIDENT_TUNING_FILE for the scope.
struct TuningEnv {
  explicit TuningEnv(const std::string& path) { ::setenv("TRIDENT_TUNING_FILE", path.c_str(), 1); }
  ~TuningEnv() { ::unsetenv("TRIDENT_TUNING_FILE"); }
};

TuningTable sample_table() {
  TuningTable t;
  t.host = "h";
  t.date = "2026-01-01 00:00:00 UTC";
  t.transport = "shm";
  t.world_size = 2;
  t.entries.push_back({OpKind::kAllReduce, Algo::kRing, {{1000, 10e-6}, {100000, 1000e-6}}});
  t.entries.push_back({OpKind::kBroadcast, Algo::kTree, {{8, 2.5e-6}}});
  return t;
}

TEST(Tuning, FileRoundTrips) {
  const TuningTable t = sample_table();
  const std::string path = temp_file("roundtrip");
  save_tuning_file(path, t);
  const TuningTable u = load_tuning_file(path);
  EXPECT_EQ(u.version, 1);
  EXPECT_EQ(u.host, t.host);
  EXPECT_EQ(u.date, t.date);
  EXPECT_EQ(u.transport, "shm");
  EXPECT_EQ(u.world_size, 2);
  ASSERT_EQ(u.entries.size(), t.entries.size());
  for (size_t i = 0; i < t.entries.size(); ++i) {
    EXPECT_EQ(u.entries[i].op, t.entries[i].op);
    EXPECT_EQ(u.entries[i].algo, t.entries[i].algo);
    ASSERT_EQ(u.entries[i].points.size(), t.entries[i].points.size());
    for (size_t k = 0; k < t.entries[i].points.size(); ++k) {
      EXPECT_EQ(u.entries[i].points[k].bytes, t.entries[i].points[k].bytes);
      EXPECT_NEAR(u.entries[i].points[k].seconds, t.entries[i].points[k].seconds, 1e-15);
    }
  }
  std::remove(path.c_str());
}

TEST(Tuning, PredictInterpolatesInLogSpace) {
  const TuningTable t = sample_table();
  // Between (1e3 B, 10 us) and (1e5 B, 1000 us), the geometric midpoint 1e4 B lies at sqrt(10 * 1000) us.
  EXPECT_NEAR(*t.predict(OpKind::kAllReduce, Algo::kRing, 1e4), 100e-6, 1e-12);
  EXPECT_NEAR(*t.predict(OpKind::kAllReduce, Algo::kRing, 1000), 10e-6, 1e-15);
  EXPECT_NEAR(*t.predict(OpKind::kAllReduce, Algo::kRing, 1), 10e-6, 1e-15);        // below: the smallest
  EXPECT_NEAR(*t.predict(OpKind::kAllReduce, Algo::kRing, 300000), 3000e-6, 1e-12);  // above: proportional
  EXPECT_FALSE(t.predict(OpKind::kAllReduce, Algo::kTree, 1000).has_value());
}

TEST(Tuning, BadFilesAreClearErrors) {
  const std::string path = temp_file("bad");
  auto expect_error = [&](const std::string& text, const std::string& needle) {
    write_text(path, text);
    try {
      load_tuning_file(path);
      ADD_FAILURE() << "no error for: " << text;
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(path), std::string::npos) << m;
      EXPECT_NE(m.find(needle), std::string::npos) << "lacks '" << needle << "': " << m;
    }
  };
  const std::string head = R"({"version":1,"transport":"shm","world_size":2,"entries":)";
  expect_error("{not json", "not valid JSON");
  expect_error(R"({"version":2,"transport":"shm","world_size":2,"entries":[]})", "version 2");
  expect_error(R"({"version":1,"world_size":2,"entries":[]})", "\"transport\"");
  expect_error(R"({"version":1,"transport":"ib","world_size":2,"entries":[]})", "transport 'ib'");
  expect_error(head + R"([{"op":"all_reduce","algo":"pairwise","bytes":[8],"p50_us":[1]}]})", "no algorithm 'pairwise'");
  expect_error(head + R"([{"op":"all_reduce","algo":"ring","bytes":[8,8],"p50_us":[1,2]}]})", "ascending");
  expect_error(head + R"([{"op":"all_reduce","algo":"ring","bytes":[8],"p50_us":[-1]}]})", "positive");
  expect_error(head + R"([{"op":"all_reduce","algo":"ring","bytes":[8,16],"p50_us":[1]}]})", "equally long");
  std::remove(path.c_str());
  // A missing file.
  try {
    load_tuning_file(path);
    ADD_FAILURE() << "no error for a missing file";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  // A group fails at creation, naming the file.
  write_text(path, "[1, 2");
  TuningEnv env(path);
  try {
    auto store = std::make_shared<HashStore>();
    new_process_group(store, 0, 1, {});
    ADD_FAILURE() << "no error for a corrupt TRIDENT_TUNING_FILE";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

// all_reduce entries for every algorithm: `fast` takes 1 us at every size, the others 100 us.
std::string all_reduce_file(Algo fast, int world, const std::string& transport) {
  std::string entries;
  for (const AlgorithmInfo* info : algorithms_for(OpKind::kAllReduce)) {
    const double us = info->algo == fast ? 1 : 100;
    entries += fmt::format(R"({}{{"op":"all_reduce","algo":"{}","bytes":[8,8388608],"p50_us":[{},{}]}})",
                           entries.empty() ? "" : ",", algo_name(info->algo), us, us * 1000);
  }
  return fmt::format(R"({{"version":1,"host":"test","date":"now","transport":"{}","world_size":{},"entries":[{}]}})",
                     transport, world, entries);
}

CollArgs all_reduce_args(size_t count) {
  CollArgs a;
  a.op = OpKind::kAllReduce;
  a.count = count;
  a.dtype = DType::kFloat32;
  a.redop = ReduceOp::kSum;
  return a;
}

CollArgs broadcast_args(size_t count) {
  CollArgs a = all_reduce_args(count);
  a.op = OpKind::kBroadcast;
  return a;
}

// The choices of a group without a tuning file (the cost model), for comparison.
std::vector<Algo> untuned_choices(const std::vector<CollArgs>& calls) {
  std::vector<Algo> out(calls.size());
  auto res = testing::run_threads(2, [&](int r, int n, std::shared_ptr<Store> st) {
    GroupOptions go;
    go.transport = "shm";
    auto pg = new_process_group(st, r, n, go);
    if (r == 0)
      for (size_t i = 0; i < calls.size(); ++i) out[i] = pg->choose_algorithm(calls[i], Algo::kAuto);
  });
  EXPECT_EQ(testing::failures(res), "");
  return out;
}

TEST(Tuning, GroupFollowsTheFile) {
  const std::vector<CollArgs> calls = {all_reduce_args(1), all_reduce_args(10000), all_reduce_args(1 << 22),
                                       broadcast_args(1 << 20)};
  const std::vector<Algo> model = untuned_choices(calls);
  const std::string path = temp_file("tree");
  write_text(path, all_reduce_file(Algo::kTree, 2, "shm"));
  TuningEnv env(path);
  auto res = testing::run_threads(2, [&](int r, int n, std::shared_ptr<Store> st) {
    GroupOptions go;
    go.transport = "shm";
    auto pg = new_process_group(st, r, n, go);
    for (size_t i = 0; i < 3; ++i) {
      Algo a = pg->choose_algorithm(calls[i], Algo::kAuto);
      TRIDENT_RANK_CHECK(a == Algo::kTree, "count {}: chose {}, the file says tree", calls[i].count, algo_name(a));
    }
    // broadcast is not in the file: the cost model decides.
    Algo b = pg->choose_algorithm(calls[3], Algo::kAuto);
    TRIDENT_RANK_CHECK(b == model[3], "broadcast: chose {}, the cost model chooses {}", algo_name(b), algo_name(model[3]));
    // A forced algorithm still wins over the file.
    TRIDENT_RANK_CHECK(pg->choose_algorithm(calls[0], Algo::kRing) == Algo::kRing, "forced ring not honoured");
    // And the chosen algorithm computes the right sum: sum over ranks of (rank + 1 + i).
    std::vector<float> x(1000);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(r + 1 + i);
    pg->all_reduce(x.data(), x.size(), DType::kFloat32, ReduceOp::kSum);
    for (size_t i = 0; i < x.size(); ++i)
      TRIDENT_RANK_CHECK(x[i] == static_cast<float>(3 + 2 * i), "x[{}] = {}", i, x[i]);
  });
  EXPECT_EQ(testing::failures(res), "");
  std::remove(path.c_str());
}

TEST(Tuning, CrossoverFollowsTheMeasurements) {
  // rd: 1 us at 8 B, 1000 us at 8 MiB; ring: 50 us at 8 B, 500 us at 8 MiB; others slower everywhere.
  const std::string path = temp_file("cross");
  std::string entries;
  for (const AlgorithmInfo* info : algorithms_for(OpKind::kAllReduce)) {
    double small = 1000, large = 1e6;
    if (info->algo == Algo::kRecursiveDoubling) small = 1, large = 1000;
    if (info->algo == Algo::kRing) small = 50, large = 500;
    entries += fmt::format(R"({}{{"op":"all_reduce","algo":"{}","bytes":[8,8388608],"p50_us":[{},{}]}})",
                           entries.empty() ? "" : ",", algo_name(info->algo), small, large);
  }
  write_text(path, fmt::format(R"({{"version":1,"transport":"shm","world_size":2,"entries":[{}]}})", entries));
  TuningEnv env(path);
  auto res = testing::run_threads(2, [&](int r, int n, std::shared_ptr<Store> st) {
    GroupOptions go;
    go.transport = "shm";
    auto pg = new_process_group(st, r, n, go);
    Algo small = pg->choose_algorithm(all_reduce_args(2), Algo::kAuto);
    Algo large = pg->choose_algorithm(all_reduce_args(2 << 20), Algo::kAuto);
    TRIDENT_RANK_CHECK(small == Algo::kRecursiveDoubling, "8 B chose {}", algo_name(small));
    TRIDENT_RANK_CHECK(large == Algo::kRing, "8 MiB chose {}", algo_name(large));
  });
  EXPECT_EQ(testing::failures(res), "");
  std::remove(path.c_str());
}

TEST(Tuning, UncoveredGroupUsesTheCostModel) {
  const std::vector<CollArgs> calls = {all_reduce_args(1), all_reduce_args(1 << 22)};
  const std::vector<Algo> model = untuned_choices(calls);
  const std::string path = temp_file("w3");
  write_text(path, all_reduce_file(Algo::kTree, 3, "shm"));  // for 3 ranks; the group has 2
  TuningEnv env(path);
  auto res = testing::run_threads(2, [&](int r, int n, std::shared_ptr<Store> st) {
    GroupOptions go;
    go.transport = "shm";
    auto pg = new_process_group(st, r, n, go);
    for (size_t i = 0; i < calls.size(); ++i) {
      Algo a = pg->choose_algorithm(calls[i], Algo::kAuto);
      TRIDENT_RANK_CHECK(a == model[i], "count {}: chose {}, the cost model chooses {}", calls[i].count, algo_name(a),
                         algo_name(model[i]));
    }
  });
  EXPECT_EQ(testing::failures(res), "");
  std::remove(path.c_str());
}

using trident::testing::CliRun;
using trident::testing::run_trident;

TEST(Tuning, BenchTuneWritesAFileTheBackendUses) {
  const std::string path = temp_file("cli");
  std::remove(path.c_str());
  CliRun r = run_trident(fmt::format("bench comm --tune {} --nproc 2 --transport shm -b 8 -e 1K -f 32 -n 2 -w 1 "
                                     "--timeout 60s",
                                     path));
  ASSERT_EQ(r.rc, 0) << r.out;
  const TuningTable t = load_tuning_file(path);
  EXPECT_EQ(t.world_size, 2);
  EXPECT_EQ(t.transport, "shm");
  // Every algorithm of all_reduce measured at 8 B and 256 B (the sizes of -b 8 -e 1K -f 32).
  for (const AlgorithmInfo* info : algorithms_for(OpKind::kAllReduce)) {
    const TuningEntry* e = t.find(OpKind::kAllReduce, info->algo);
    ASSERT_NE(e, nullptr) << "all_reduce " << algo_name(info->algo) << " missing\n" << r.out;
    ASSERT_EQ(e->points.size(), 2u);
    EXPECT_EQ(e->points[0].bytes, 8);
    EXPECT_EQ(e->points[1].bytes, 256);
  }
  EXPECT_NE(t.find(OpKind::kBroadcast, Algo::kTree), nullptr);
  EXPECT_EQ(t.find(OpKind::kBarrier, Algo::kDissemination), nullptr);  // one algorithm: nothing to choose

  // The backend reads it, and TRIDENT_DEBUG=comm says the choice came from the tuning file.
  CliRun u = run_trident("bench comm --nproc 2 --transport shm -b 8 -e 8 -n 1 -w 0 --timeout 60s --inplace --op all_reduce",
                         fmt::format("TRIDENT_TUNING_FILE={} TRIDENT_DEBUG=comm", path));
  ASSERT_EQ(u.rc, 0) << u.out;
  EXPECT_NE(u.out.find("(tuning)"), std::string::npos) << u.out;
  std::remove(path.c_str());
}

}  // namespace
}  // namespace trident::tuning_test
