// Tests of `trident bench comm`: the built CLI run end to end (--nproc and under `trident launch`), its
// JSON checked against formulas computed here, and the library's parsing and verifiable inputs.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "harness/cli_run.h"
#include "trident/bench/comm_bench.h"
#include "trident/bench/verifiable.h"
#include "trident/comm/algorithms/algorithm.h"
#include "trident/core/error.h"

namespace {

using nlohmann::json;

using trident::testing::CliRun;
using trident::testing::run_trident;

std::string temp_path(const std::string& stem) {
  return ::testing::TempDir() + "/trident_bench_" + stem + "_" + std::to_string(::getpid()) + ".json";
}

json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f.good()) return json();  // null: the caller reports it with the command's output
  return json::parse(f, nullptr, /*allow_exceptions=*/false);
}

// nccl-tests' busbw factors, written out independently of the library.
double expected_factor(const std::string& op, int n) {
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "broadcast" || op == "reduce") return 1.0;
  if (op == "barrier") return 0.0;
  return static_cast<double>(n - 1) / n;  // all_gather, reduce_scatter, all_to_all, gather, scatter
}
// nccl-tests' size: the per-rank buffer, times the world for ops whose size is the whole gathered buffer.
size_t expected_size(const std::string& op, size_t count_per_rank, int n) {
  const bool whole = op == "all_gather" || op == "reduce_scatter" || op == "all_to_all" || op == "gather" ||
                     op == "scatter";
  return count_per_rank * (whole ? n : 1) * 4;  // float32
}

// Checks every row of a --check run: all exact, sizes and bandwidths as nccl-tests defines them.
void check_records(const json& rows, int world, const std::set<std::string>& want_ops) {
  EXPECT_TRUE(rows.is_array());
  EXPECT_FALSE(rows.empty());
  if (!rows.is_array() || rows.empty()) return;
  std::set<std::string> ops;
  std::map<std::string, std::set<bool>> placements;
  for (const auto& r : rows) {
    const std::string op = r.at("op");
    ops.insert(op);
    placements[op].insert(r.at("inplace").get<bool>());
    SCOPED_TRACE(r.dump());
    EXPECT_FALSE(r.at("wrong").is_null()) << "--check was given, so every row must carry a wrong count";
    if (r.at("wrong").is_null()) continue;
    EXPECT_EQ(r.at("wrong").get<uint64_t>(), 0u);
    EXPECT_EQ(r.at("world_size").get<int>(), world);
    EXPECT_EQ(r.at("transport").get<std::string>(), "shm");
    EXPECT_NE(r.at("algo").get<std::string>(), "auto") << "the algorithm that ran, not the request";
    const double t = r.at("time_us"), algbw = r.at("algbw"), busbw = r.at("busbw");
    EXPECT_GT(t, 0.0);
    EXPECT_LE(r.at("lat_min_us").get<double>(), r.at("lat_p50_us").get<double>());
    EXPECT_LE(r.at("lat_p50_us").get<double>(), r.at("lat_p99_us").get<double>());
    if (op == "barrier") {
      EXPECT_EQ(r.at("size").get<size_t>(), 0u);
      EXPECT_EQ(busbw, 0.0);
      continue;
    }
    const size_t cpr = r.at("count_per_rank"), size = r.at("size");
    EXPECT_EQ(size, expected_size(op, cpr, world));
    EXPECT_EQ(r.at("count").get<size_t>(), size / 4);
    EXPECT_EQ(r.at("dtype").get<std::string>(), "float32");
    const double want_algbw = static_cast<double>(size) / (t * 1e-6) / 1e9;
    EXPECT_NEAR(algbw, want_algbw, 1e-9 * std::max(1.0, want_algbw));
    EXPECT_NEAR(busbw, want_algbw * expected_factor(op, world), 1e-9 * std::max(1.0, want_algbw));
    const bool rooted = op == "broadcast" || op == "reduce" || op == "gather" || op == "scatter";
    EXPECT_EQ(r.at("root").get<int>(), rooted ? 0 : -1);
  }
  EXPECT_EQ(ops, want_ops);
  for (const auto& op : want_ops) {
    if (op == "barrier") continue;
    std::set<bool> want = op == "broadcast" ? std::set<bool>{true} : std::set<bool>{false, true};
    EXPECT_EQ(placements[op], want) << op << ": out-of-place and in-place (broadcast: in-place only)";
  }
}

const std::set<std::string> kAllOps = {"broadcast",  "reduce",         "all_reduce", "gather",    "scatter",
                                       "all_gather", "reduce_scatter", "all_to_all", "barrier"};

void all_ops_checked(int nproc) {
  const std::string path = temp_path("all" + std::to_string(nproc));
  CliRun r = run_trident(fmt::format("bench comm --nproc {} --op all --check -b 8 -e 64K -f 8 --iters 3 --warmup 1 "
                                  "--json {}",
                                  nproc, path));
  json rows = read_json(path);
  ASSERT_TRUE(rows.is_array()) << "no JSON array in " << path << "; output:\n" << r.out;
  check_records(rows, nproc, kAllOps);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("# Out of bounds values : 0 OK"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("# Avg bus bandwidth"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("# /dev/shm in use      : "), std::string::npos) << r.out;  // what the transport costs
  EXPECT_NE(r.out.find(fmt::format("# world size {}", nproc)), std::string::npos) << r.out;
  // The sweep: 8, 64, 512, 4K, 32K bytes for all_reduce (every size once per placement).
  std::multiset<size_t> sizes;
  for (const auto& row : rows)
    if (row.at("op") == "all_reduce") sizes.insert(row.at("size").get<size_t>());
  EXPECT_EQ(sizes, (std::multiset<size_t>{8, 8, 64, 64, 512, 512, 4096, 4096, 32768, 32768}));
  std::remove(path.c_str());
}

TEST(BenchCommCli, AllOpsCheckedOnTwoRanks) { all_ops_checked(2); }
TEST(BenchCommCli, AllOpsCheckedOnThreeRanks) { all_ops_checked(3); }

TEST(BenchCommCli, AlgoAllRunsEveryAlgorithmAndAuto) {
  const std::string path = temp_path("algo_all");
  CliRun r = run_trident(fmt::format("bench comm --nproc 2 --op all_reduce,all_gather,broadcast,reduce_scatter --algo all "
                                  "--check -b 8 -e 4K -f 8 --iters 2 --warmup 1 --json {}",
                                  path));
  ASSERT_EQ(r.rc, 0) << r.out;
  json rows = read_json(path);
  check_records(rows, 2, {"all_reduce", "all_gather", "broadcast", "reduce_scatter"});
  for (trident::OpKind op : {trident::OpKind::kAllReduce, trident::OpKind::kAllGather, trident::OpKind::kBroadcast,
                             trident::OpKind::kReduceScatter}) {
    std::set<std::string> forced, all;
    bool saw_auto = false;
    for (const auto& row : rows) {
      if (row.at("op") != trident::op_name(op)) continue;
      if (row.at("algo_forced").get<bool>()) forced.insert(row.at("algo").get<std::string>());
      else saw_auto = true;
    }
    for (const trident::AlgorithmInfo* info : trident::algorithms_for(op)) all.insert(trident::algo_name(info->algo));
    EXPECT_EQ(forced, all) << trident::op_name(op) << ": every algorithm (2 ranks: all apply)";
    EXPECT_TRUE(saw_auto) << trident::op_name(op) << ": the auto choice too";
  }
  std::remove(path.c_str());
}

TEST(BenchCommCli, RunsUnderTridentLaunch) {
  const std::string path = temp_path("launch");
  CliRun r = run_trident(fmt::format("launch -n 2 --master-port 0 -- {} bench comm --op all_reduce,all_to_all --check "
                                  "-b 1K -e 8K -f 8 --iters 2 --warmup 1 --transport tcp --json {}",
                                  TRIDENT_BIN, path));
  ASSERT_EQ(r.rc, 0) << r.out;
  json rows = read_json(path);
  ASSERT_EQ(rows.size(), 8u);  // 2 ops x 2 sizes x 2 placements
  for (const auto& row : rows) {
    EXPECT_EQ(row.at("wrong").get<uint64_t>(), 0u);
    EXPECT_EQ(row.at("transport").get<std::string>(), "tcp");
    EXPECT_EQ(row.at("transport_requested").get<std::string>(), "tcp");
  }
  // Only rank 0 prints the table: one header.
  size_t headers = 0;
  for (size_t at = r.out.find("# trident bench comm"); at != std::string::npos;
       at = r.out.find("# trident bench comm", at + 1))
    ++headers;
  EXPECT_EQ(headers, 1u) << r.out;
  std::remove(path.c_str());
}

TEST(BenchCommCli, BadFlagsNameTheFlagAndTheAllowedValues) {
  struct Case {
    std::string args, flag, allowed;
  };
  for (const Case& c : std::vector<Case>{
           {"--op bogus", "--op", "all_reduce"},
           {"--op all_reduce,nope", "--op", "reduce_scatter"},
           {"--dtype complex", "--dtype", "bfloat16"},
           {"--redop xor", "--redop", "prod"},
           {"--algo fastest", "--algo", "ring"},
           {"--transport carrier-pigeon", "--transport", "shm"},
           {"-b 1Q", "-b/--minbytes", ""},
           {"-b 1M -e 1K", "-e/--maxbytes", ""},
           {"-f 1", "-f/--stepfactor", ">= 2"},
           {"--root 5", "--root", "[0, 2)"},
           {"--dtype uint8 --op all_reduce", "--dtype uint8", "data movement"},
           {"--backend gloo", "--backend 'gloo'", "native, mpi"},
           {"--backend mpi", "--backend mpi", "mpirun -np N"},
       }) {
    SCOPED_TRACE(c.args);
    CliRun r = run_trident("bench comm --nproc 2 " + c.args);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find(c.flag), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(c.allowed), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("# trident bench comm"), std::string::npos) << "nothing may run after a bad flag";
  }
}

// ---- library ----

TEST(BenchCommLib, ParseOps) {
  using trident::OpKind;
  EXPECT_EQ(trident::bench::parse_ops("all").size(), 9u);
  EXPECT_EQ(trident::bench::parse_ops("all_reduce, allgather,all_reduce"),
            (std::vector<OpKind>{OpKind::kAllReduce, OpKind::kAllGather}));
  EXPECT_THROW(trident::bench::parse_ops("send"), trident::InvalidArgument);  // point-to-point: not a collective row
  EXPECT_THROW(trident::bench::parse_ops(""), trident::InvalidArgument);
  bool all = false;
  EXPECT_EQ(trident::bench::parse_algos("ring,auto", &all), (std::vector<trident::Algo>{trident::Algo::kRing,
                                                                                        trident::Algo::kAuto}));
  EXPECT_FALSE(all);
  trident::bench::parse_algos("all", &all);
  EXPECT_TRUE(all);
}

// The reference a rank computes alone equals the reduction of what the other ranks fill, element by element,
// in every dtype and reduce op, and a single changed element or an unwritten (poisoned) one is counted.
TEST(BenchCommLib, VerifiableInputsReduceExactly) {
  using trident::DType;
  using trident::ReduceOp;
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16, DType::kInt32, DType::kInt64}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kProd}) {
      for (int world : {1, 3, 8}) {
        SCOPED_TRACE(fmt::format("{} {} world {}", trident::dtype_name(dt), trident::reduce_op_name(op), world));
        const size_t count = 257;
        const size_t es = trident::dtype_size(dt);
        // Reduce the ranks' filled buffers here in double, then compare with reduced_value().
        std::vector<double> acc(count);
        std::vector<char> buf(count * es);
        for (int r = 0; r < world; ++r) {
          trident::bench::fill_input(buf.data(), count, dt, r, 0, 5, op, true);
          for (size_t i = 0; i < count; ++i) {
            double v = trident::bench::load_value(buf.data(), i, dt);
            if (r == 0) acc[i] = v;
            else if (op == ReduceOp::kSum || op == ReduceOp::kAvg) acc[i] += v;
            else if (op == ReduceOp::kProd) acc[i] *= v;
            else if (op == ReduceOp::kMax) acc[i] = std::max(acc[i], v);
            else acc[i] = std::min(acc[i], v);
          }
        }
        for (size_t i = 0; i < count; ++i) {
          double want = acc[i];
          if (op == ReduceOp::kAvg && world > 1) {
            if (dt == DType::kInt32 || dt == DType::kInt64) want = std::trunc(want / world);
            else if (dt == DType::kFloat64) want = want / world;
            else want = trident::bench::round_to(static_cast<float>(want) / static_cast<float>(world), dt);
          }
          ASSERT_EQ(trident::bench::reduced_value(world, i, 5, dt, op), want) << "element " << i;
        }
        // A correct output buffer has no wrong elements; one changed element and one poisoned are both found.
        std::vector<char> out(count * es);
        for (size_t i = 0; i < count; ++i) {
          double v = trident::bench::reduced_value(world, i, 5, dt, op);
          // Store the expected value in the dtype's own representation.
          switch (dt) {
            case DType::kFloat32: reinterpret_cast<float*>(out.data())[i] = static_cast<float>(v); break;
            case DType::kFloat64: reinterpret_cast<double*>(out.data())[i] = v; break;
            case DType::kBFloat16:
              reinterpret_cast<uint16_t*>(out.data())[i] = trident::float_to_bf16(static_cast<float>(v));
              break;
            case DType::kFloat16:
              reinterpret_cast<uint16_t*>(out.data())[i] = trident::float_to_fp16(static_cast<float>(v));
              break;
            case DType::kInt32: reinterpret_cast<int32_t*>(out.data())[i] = static_cast<int32_t>(v); break;
            case DType::kInt64: reinterpret_cast<int64_t*>(out.data())[i] = static_cast<int64_t>(v); break;
            default: break;
          }
        }
        EXPECT_EQ(trident::bench::count_wrong_reduced(out.data(), count, dt, world, 0, 5, op), 0u);
        trident::bench::poison(out.data() + 3 * es, 1, dt);
        EXPECT_EQ(trident::bench::count_wrong_reduced(out.data(), count, dt, world, 0, 5, op), 1u);
        // A different iteration's reference disagrees somewhere (inputs change every iteration).
        EXPECT_GT(trident::bench::count_wrong_reduced(out.data(), count, dt, world, 0, 6, op), 1u);
      }
    }
  }
}

TEST(BenchCommLib, MovedBlocksFromTheWrongRankAreCounted) {
  using trident::DType;
  const size_t c = 64;
  const int n = 3;
  std::vector<float> gathered(c * n);
  for (int r = 0; r < n; ++r)
    trident::bench::fill_input(gathered.data() + r * c, c, DType::kFloat32, r, 0, 1, trident::ReduceOp::kSum, false);
  auto src_rank = [&](size_t i) { return static_cast<int>(i / c); };
  auto src_k = [&](size_t i) { return i % c; };
  EXPECT_EQ(trident::bench::count_wrong_moved(gathered.data(), c * n, DType::kFloat32, 1, trident::ReduceOp::kSum,
                                              false, src_rank, src_k),
            0u);
  std::swap_ranges(gathered.begin(), gathered.begin() + c, gathered.begin() + c);  // blocks 0 and 1 swapped
  EXPECT_GT(trident::bench::count_wrong_moved(gathered.data(), c * n, DType::kFloat32, 1, trident::ReduceOp::kSum,
                                              false, src_rank, src_k),
            c);
}

}  // namespace
