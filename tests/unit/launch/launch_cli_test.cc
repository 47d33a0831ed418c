// `trident launch` end to end: runs the built CLI (TRIDENT_BIN) and checks what its ranks saw and printed,
// how it reports failures, and that it leaves no rank running. Every wait has a hang guard (kCliHangGuard): a
// guard that fires fails the test; it is not a performance assertion.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "harness/temp_dir.h"
#include "process_runner.h"
#include "trident/comm/store/rendezvous.h"
#include "trident/comm/store/tcp_store.h"
#include "trident/core/env.h"
#include "trident/core/error.h"

namespace {

using trident::testing::make_env;
using trident::testing::parse_fields;
using trident::testing::ProcessRunner;
using trident::testing::split_lines;

constexpr double kCliHangGuard = 15.0;

// Launcher-owned variables must come from the launcher, never from the test's own environment.
const std::vector<std::string> kLaunchVars = {"RANK",        "WORLD_SIZE",          "LOCAL_RANK",
                                              "LOCAL_WORLD_SIZE", "GROUP_RANK",    "GROUP_WORLD_SIZE",
                                              "MASTER_ADDR", "MASTER_PORT",         "TRIDENT_STORE_TOKEN",
                                              "TRIDENT_STORE_HOSTED", "TRIDENT_LAUNCH_TEST_CHILD"};

struct Outcome {
  bool finished = false;  // false: the hang guard fired
  int exit_code = -1;     // the launcher's exit status (it always exits normally)
  std::string out, err;
};

std::vector<std::string> launch_argv(const std::vector<std::string>& args) {
  if (::access(TRIDENT_BIN, X_OK) != 0) ADD_FAILURE() << "the CLI is not built at " << TRIDENT_BIN;
  std::vector<std::string> argv = {TRIDENT_BIN, "launch"};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

Outcome run_launch(const std::vector<std::string>& args, const std::vector<std::string>& extra_env = {}) {
  ProcessRunner p(launch_argv(args), make_env(kLaunchVars, extra_env));
  auto status = p.wait(kCliHangGuard);
  Outcome o;
  o.out = p.out();
  o.err = p.err();
  if (status) {
    o.finished = true;
    EXPECT_TRUE(WIFEXITED(*status)) << "the launcher itself died: status " << *status << "\n" << o.err;
    if (WIFEXITED(*status)) o.exit_code = WEXITSTATUS(*status);
  }
  return o;
}

// "pid 123" lines printed by ranks -> pids.
std::vector<pid_t> printed_pids(const std::string& out) {
  std::vector<pid_t> pids;
  for (const auto& line : split_lines(out)) {
    auto at = line.find("pid ");
    if (at != std::string::npos) pids.push_back(static_cast<pid_t>(std::stol(line.substr(at + 4))));
  }
  return pids;
}

void expect_all_gone(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) {
    errno = 0;
    EXPECT_EQ(::kill(pid, 0), -1) << "rank process " << pid << " is still alive after the launcher returned";
    EXPECT_EQ(errno, ESRCH) << "pid " << pid;
  }
}

std::string line_starting(const std::string& text, const std::string& prefix) {
  for (const auto& line : split_lines(text)) {
    if (line.rfind(prefix, 0) == 0) return line;
  }
  return {};
}

bool is_hex(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

const char* kPrintEnv =
    "echo R=$RANK W=$WORLD_SIZE L=$LOCAL_RANK LW=$LOCAL_WORLD_SIZE G=$GROUP_RANK GW=$GROUP_WORLD_SIZE "
    "A=$MASTER_ADDR P=$MASTER_PORT T=$TRIDENT_STORE_TOKEN H=$TRIDENT_STORE_HOSTED";

class LaunchEnv : public ::testing::TestWithParam<int> {};

TEST_P(LaunchEnv, EveryRankGetsItsOwnEnvironment) {
  const int n = GetParam();
  Outcome o = run_launch({"--nproc-per-node", std::to_string(n), "--master-port", "0", "--", "sh", "-c", kPrintEnv});
  ASSERT_TRUE(o.finished);
  ASSERT_EQ(o.exit_code, 0) << o.err;
  auto lines = split_lines(o.out);
  ASSERT_EQ(lines.size(), static_cast<size_t>(n)) << o.out;
  std::multiset<int> ranks;
  std::set<std::string> ports, tokens;
  for (const auto& line : lines) {
    auto f = parse_fields(line);
    const int rank = std::stoi(f["R"]);
    ranks.insert(rank);
    EXPECT_EQ(f["W"], std::to_string(n)) << line;
    EXPECT_EQ(f["L"], std::to_string(rank)) << line;  // one node: local rank == rank
    EXPECT_EQ(f["LW"], std::to_string(n)) << line;
    EXPECT_EQ(f["G"], "0") << line;
    EXPECT_EQ(f["GW"], "1") << line;
    EXPECT_EQ(f["A"], "127.0.0.1") << line;
    EXPECT_EQ(f["H"], "1") << line;
    ports.insert(f["P"]);
    tokens.insert(f["T"]);
  }
  for (int r = 0; r < n; ++r) EXPECT_EQ(ranks.count(r), 1u) << "rank " << r << " in:\n" << o.out;
  ASSERT_EQ(ports.size(), 1u) << "all ranks must see one MASTER_PORT";
  const int port = std::stoi(*ports.begin());
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
  ASSERT_EQ(tokens.size(), 1u) << "all ranks must share one token";
  EXPECT_EQ(tokens.begin()->size(), 32u) << "128-bit token as hex: " << *tokens.begin();
  EXPECT_TRUE(is_hex(*tokens.begin())) << *tokens.begin();
}

INSTANTIATE_TEST_SUITE_P(Worlds, LaunchEnv, ::testing::Values(1, 3, 5));

TEST(Launch, FreshTokenPerRunAndInheritedTokenKept) {
  Outcome a = run_launch({"-n", "1", "--master-port", "0", "--", "sh", "-c", kPrintEnv});
  Outcome b = run_launch({"-n", "1", "--master-port", "0", "--", "sh", "-c", kPrintEnv});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_NE(parse_fields(a.out)["T"], parse_fields(b.out)["T"]);
  Outcome c = run_launch({"-n", "2", "--master-port", "0", "--", "sh", "-c", kPrintEnv},
                         {"TRIDENT_STORE_TOKEN=0123456789abcdef"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  for (const auto& line : split_lines(c.out)) EXPECT_EQ(parse_fields(line)["T"], "0123456789abcdef") << line;
}

// Node 0 of a two-node job listens on a port the kernel picks (--master-port 0) and writes it to its
// --port-file; returns that port once the file appears, or -1 when it does not within the hang guard. Nothing
// picks a port and binds it later, so no other program on the machine can take it in between.
int port_written_by(ProcessRunner& node0, const std::string& file) {
  int port = -1;
  node0.read_until(
      [&] {
        std::ifstream in(file);
        int p = -1;
        if (!(in >> p)) return false;
        port = p;
        return true;
      },
      kCliHangGuard);
  return port;
}

TEST(Launch, SecondNodeNumbersItsRanksAfterNodeZero) {
  trident::testing::TempDir dir("launch-port");
  const std::string port_file = (dir.path / "port").string();
  const std::vector<std::string> env = make_env(kLaunchVars, {"TRIDENT_STORE_TOKEN=sharedsecret"});
  auto node = [&](int node_rank, const std::string& port, std::vector<std::string> extra) {
    std::vector<std::string> args = {"--nproc", "2", "--nnodes", "2", "--node-rank", std::to_string(node_rank),
                                     "--master-addr", "127.0.0.1", "--master-port", port};
    args.insert(args.end(), extra.begin(), extra.end());
    for (const char* a : {"--", "sh", "-c", kPrintEnv}) args.push_back(a);
    return launch_argv(args);
  };
  ProcessRunner node0(node(0, "0", {"--port-file", port_file}), env);
  const int port = port_written_by(node0, port_file);
  ASSERT_GT(port, 0) << "node 0 wrote no port to " << port_file << ": " << node0.err();
  ProcessRunner node1(node(1, std::to_string(port), {}), env);
  auto s0 = node0.wait(kCliHangGuard);
  auto s1 = node1.wait(kCliHangGuard);
  ASSERT_TRUE(s0 && s1) << node0.err() << node1.err();
  ASSERT_EQ(*s0, 0) << node0.err();
  ASSERT_EQ(*s1, 0) << node1.err();
  for (int node_rank : {0, 1}) {
    auto lines = split_lines(node_rank == 0 ? node0.out() : node1.out());
    ASSERT_EQ(lines.size(), 2u);
    std::set<int> ranks;
    for (const auto& line : lines) {
      auto f = parse_fields(line);
      ranks.insert(std::stoi(f["R"]));
      EXPECT_EQ(std::stoi(f["R"]), node_rank * 2 + std::stoi(f["L"])) << line;
      EXPECT_EQ(f["W"], "4") << line;
      EXPECT_EQ(f["LW"], "2") << line;
      EXPECT_EQ(f["G"], std::to_string(node_rank)) << line;
      EXPECT_EQ(f["GW"], "2") << line;
      EXPECT_EQ(f["A"], "127.0.0.1") << line;
      EXPECT_EQ(f["P"], std::to_string(port)) << line;
      EXPECT_EQ(f["T"], "sharedsecret") << line;
      EXPECT_EQ(f["H"], "1") << line;
    }
    EXPECT_EQ(ranks, (std::set<int>{node_rank * 2, node_rank * 2 + 1}));
  }
}

TEST(Launch, TagOutputPrefixesEveryLineOfBothStreams) {
  const char* cmd = "echo out$RANK; echo err$RANK >&2; printf tail$RANK";  // the last line has no newline
  Outcome tagged = run_launch({"-n", "3", "--tag-output", "--master-port", "0", "--", "sh", "-c", cmd});
  ASSERT_EQ(tagged.exit_code, 0) << tagged.err;
  auto out = split_lines(tagged.out);
  auto err = split_lines(tagged.err);
  std::sort(out.begin(), out.end());
  std::sort(err.begin(), err.end());
  std::vector<std::string> want_out, want_err;
  for (int r = 0; r < 3; ++r) {
    want_out.push_back("[rank " + std::to_string(r) + "] out" + std::to_string(r));
    want_out.push_back("[rank " + std::to_string(r) + "] tail" + std::to_string(r));
    want_err.push_back("[rank " + std::to_string(r) + "] err" + std::to_string(r));
  }
  std::sort(want_out.begin(), want_out.end());
  std::sort(want_err.begin(), want_err.end());
  EXPECT_EQ(out, want_out) << tagged.out;
  EXPECT_EQ(err, want_err) << tagged.err;

  Outcome plain = run_launch({"-n", "2", "--master-port", "0", "--", "sh", "-c", cmd});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  out = split_lines(plain.out);
  std::sort(out.begin(), out.end());
  EXPECT_EQ(out, (std::vector<std::string>{"out0", "out1", "tail0", "tail1"})) << plain.out;
}

TEST(Launch, ShortAndAliasFlagsAndCommandWithoutSeparator) {
  for (const char* flag : {"-n", "--nproc", "--nproc-per-node"}) {
    Outcome o = run_launch({flag, "2", "--master-port", "0", "--", "echo", "-n", "x"});
    ASSERT_EQ(o.exit_code, 0) << flag << ": " << o.err;
    EXPECT_EQ(o.out, "x\nx\n") << flag;  // "-n" after "--" belongs to echo
  }
  Outcome o = run_launch({"-n", "2", "--master-port", "0", "sh", "-c", "echo R$RANK"});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  auto lines = split_lines(o.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"R0", "R1"}));
}

TEST(Launch, FailingRankStopsTheOthersAndIsNamed) {
  const char* cmd =
      "echo pid $$; if [ $RANK = 2 ]; then echo boom-2; echo bad-news >&2; exit 3; fi; exec sleep 60";
  Outcome o = run_launch({"-n", "4", "--master-port", "0", "--", "sh", "-c", cmd});
  ASSERT_TRUE(o.finished) << "the launcher did not stop the sleeping ranks; stderr:\n" << o.err;
  EXPECT_EQ(o.exit_code, 3) << o.err;  // the failed rank's own exit code
  const std::string report = line_starting(o.err, "trident launch: rank 2 (pid ");
  ASSERT_FALSE(report.empty()) << o.err;
  EXPECT_NE(report.find("exited with code 3"), std::string::npos) << report;
  EXPECT_NE(report.find("stopped the other 3 ranks"), std::string::npos) << report;
  // The report line is followed by rank 2's last lines, in order.
  auto err = split_lines(o.err);
  auto at = std::find(err.begin(), err.end(), report);
  ASSERT_NE(at, err.end());
  std::vector<std::string> tail(at + 1, err.end());
  // Its stdout and stderr lines (the two pipes may be read in either order).
  std::sort(tail.begin(), tail.end());
  EXPECT_EQ(tail.size(), 3u) << o.err;
  EXPECT_TRUE(std::binary_search(tail.begin(), tail.end(), "[rank 2] boom-2")) << o.err;
  EXPECT_TRUE(std::binary_search(tail.begin(), tail.end(), "[rank 2] bad-news")) << o.err;
  EXPECT_EQ(line_starting(o.err, "trident launch: rank 0"), "") << "only the first failure is reported";
  expect_all_gone(printed_pids(o.out));
}

TEST(Launch, RankKilledBySignalIsNamedWithTheSignal) {
  const char* cmd = "echo pid $$; if [ $RANK = 1 ]; then kill -9 $$; fi; exec sleep 60";
  Outcome o = run_launch({"-n", "3", "--master-port", "0", "--", "sh", "-c", cmd});
  ASSERT_TRUE(o.finished) << o.err;
  EXPECT_EQ(o.exit_code, 128 + SIGKILL) << o.err;
  const std::string report = line_starting(o.err, "trident launch: rank 1 (pid ");
  ASSERT_FALSE(report.empty()) << o.err;
  EXPECT_NE(report.find("was killed by signal 9 (SIGKILL)"), std::string::npos) << report;
  expect_all_gone(printed_pids(o.out));
}

TEST(Launch, RankIgnoringSigtermIsKilledAfterTheGracePeriod) {
  // Rank 1 ignores SIGTERM (and its sleeps inherit that); rank 0 fails once rank 1 is in that state, so only
  // the SIGKILL after the grace period can end rank 1.
  char dir[] = "/tmp/trident-launch-test-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string ready = std::string(dir) + "/ready";
  const char* cmd =
      "if [ $RANK = 0 ]; then while [ ! -f \"$READY\" ]; do sleep 0.01; done; exit 7; fi; "
      "trap '' TERM; echo pid $$; touch \"$READY\"; while true; do sleep 0.1; done";
  ProcessRunner p(launch_argv({"-n", "2", "--grace-period", "0.5", "--master-port", "0", "--", "sh", "-c", cmd}),
                  make_env(kLaunchVars, {"READY=" + ready}));
  auto status = p.wait(kCliHangGuard);
  ASSERT_TRUE(status.has_value()) << "hung; stderr:\n" << p.err();
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 7) << p.err();
  EXPECT_NE(p.err().find("trident launch: rank 0 (pid "), std::string::npos) << p.err();
  auto pids = printed_pids(p.out());
  EXPECT_EQ(pids.size(), 1u) << p.out();
  expect_all_gone(pids);
  ::unlink(ready.c_str());
  ::rmdir(dir);
}

TEST(Launch, SignalToLauncherStopsEveryRank) {
  // With --max-restarts too: a signal to the launcher is no rank failure and restarts nothing.
  for (auto [sig, restarts] : {std::pair{SIGTERM, 0}, std::pair{SIGINT, 0}, std::pair{SIGTERM, 2}}) {
    ProcessRunner p(launch_argv({"-n", "3", "--max-restarts", std::to_string(restarts), "--master-port", "0", "--",
                                 "sh", "-c", "echo pid $$; exec sleep 60"}),
                    make_env(kLaunchVars, {}));
    ASSERT_TRUE(p.read_until([&] { return printed_pids(p.out()).size() == 3; }, kCliHangGuard)) << p.out() << p.err();
    auto pids = printed_pids(p.out());
    ASSERT_EQ(::kill(p.pid(), sig), 0);
    auto status = p.wait(kCliHangGuard);
    ASSERT_TRUE(status.has_value()) << "hung after signal " << sig;
    ASSERT_TRUE(WIFEXITED(*status)) << "the launcher must stop its ranks, then exit";
    EXPECT_EQ(WEXITSTATUS(*status), 128 + sig);
    EXPECT_NE(p.err().find(sig == SIGTERM ? "received SIGTERM" : "received SIGINT"), std::string::npos) << p.err();
    EXPECT_EQ(p.err().find("restart"), std::string::npos) << p.err();
    EXPECT_EQ(printed_pids(p.out()).size(), 3u) << "no rank may be started again: " << p.out();
    expect_all_gone(pids);
  }
}

// Alive and not a zombie (an orphan's zombie may linger when nobody reaps it here).
bool alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return false;
  char buf[512] = {0};
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const char* close_paren = std::strrchr(buf, ')');
  return n > 0 && close_paren != nullptr && close_paren[1] == ' ' && close_paren[2] != 'Z';
}

TEST(Launch, RanksDieWithAHardKilledLauncher) {
  ProcessRunner p(launch_argv({"-n", "2", "--master-port", "0", "--", "sh", "-c", "echo pid $$; exec sleep 60"}),
                  make_env(kLaunchVars, {}));
  ASSERT_TRUE(p.read_until([&] { return printed_pids(p.out()).size() == 2; }, kCliHangGuard)) << p.err();
  auto pids = printed_pids(p.out());
  ASSERT_EQ(::kill(p.pid(), SIGKILL), 0);
  p.wait(kCliHangGuard);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kCliHangGuard);
  for (pid_t pid : pids) {
    while (alive(pid) && std::chrono::steady_clock::now() < deadline) ::usleep(10000);
    EXPECT_FALSE(alive(pid)) << "rank " << pid << " outlived its SIGKILLed launcher";
  }
}

TEST(Launch, CommandThatCannotRunIsAClearError) {
  Outcome o = run_launch({"-n", "2", "--master-port", "0", "--", "no-such-command-trident-test"});
  ASSERT_TRUE(o.finished);
  EXPECT_EQ(o.exit_code, 127);
  EXPECT_NE(o.err.find("cannot execute 'no-such-command-trident-test'"), std::string::npos) << o.err;
  Outcome d = run_launch({"-n", "1", "--master-port", "0", "--", "/"});  // a directory
  EXPECT_EQ(d.exit_code, 127);
  EXPECT_NE(d.err.find("cannot execute '/'"), std::string::npos) << d.err;
}

TEST(Launch, BadFlagsAreClearErrors) {
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> env;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"-n", "0", "--", "true"}, {}, "--nproc-per-node 0"},
      {{"--nnodes", "2", "--node-rank", "2", "--", "true"}, {"TRIDENT_STORE_TOKEN=x"}, "--node-rank 2"},
      {{"--nnodes", "2", "--node-rank", "-1", "--", "true"}, {"TRIDENT_STORE_TOKEN=x"}, "--node-rank -1"},
      {{"-n", "2"}, {}, "no command to launch"},
      {{"-n", "2", "--"}, {}, "no command to launch"},
      {{"--nnodes", "2", "--", "true"}, {}, "TRIDENT_STORE_TOKEN"},
      {{"--nnodes", "2", "--master-port", "0", "--", "true"}, {"TRIDENT_STORE_TOKEN=x"}, "add --port-file FILE"},
      {{"--nnodes", "2", "--node-rank", "1", "--master-port", "0", "--", "true"},
       {"TRIDENT_STORE_TOKEN=x"},
       "--master-port 0 with --nnodes 2 on node 1"},
      {{"--nnodes", "2", "--node-rank", "1", "--port-file", "/tmp/p", "--", "true"},
       {"TRIDENT_STORE_TOKEN=x"},
       "--port-file /tmp/p on node 1: only node 0"},
      {{"--master-port", "0", "--port-file", "/nonexistent-dir/port", "--", "true"},
       {},
       "--port-file /nonexistent-dir/port: cannot write"},
      {{"--master-port", "70000", "--", "true"}, {}, "--master-port 70000"},
  };
  for (const auto& c : cases) {
    Outcome o = run_launch(c.args, c.env);
    ASSERT_TRUE(o.finished);
    EXPECT_NE(o.exit_code, 0) << c.message;
    EXPECT_NE(o.err.find(c.message), std::string::npos) << "expected '" << c.message << "' in:\n" << o.err;
    EXPECT_EQ(o.out, "") << "nothing may run on a bad flag";
  }
}

TEST(Launch, MaxRestartsStartsEveryRankAgainAfterAFailure) {
  // Round 0: rank 1 fails while the others sleep (they are stopped); round 1: every rank succeeds.
  const char* cmd =
      "echo pid $$; echo round=$TRIDENT_RESTART_COUNT elastic=$TORCHELASTIC_RESTART_COUNT "
      "max=$TRIDENT_MAX_RESTARTS/$TORCHELASTIC_MAX_RESTARTS rank=$RANK; "
      "if [ $TRIDENT_RESTART_COUNT = 0 ]; then if [ $RANK = 1 ]; then exit 7; fi; exec sleep 60; fi";
  Outcome o = run_launch({"-n", "3", "--max-restarts", "2", "--master-port", "0", "--", "sh", "-c", cmd});
  ASSERT_TRUE(o.finished) << o.err;
  EXPECT_EQ(o.exit_code, 0) << o.err;
  const std::string report = line_starting(o.err, "trident launch: rank 1 (pid ");
  EXPECT_NE(report.find("exited with code 7; stopped the other 2 ranks; restarting all 3 ranks (restart 1 of 2)"),
            std::string::npos)
      << o.err;
  EXPECT_NE(o.err.find("trident launch: every rank finished after 1 restart (--max-restarts 2)"), std::string::npos)
      << o.err;
  // (Ranks 0 and 2 of round 0 may be stopped before they print.)
  EXPECT_NE(o.out.find("round=0 elastic=0 max=2/2 rank=1"), std::string::npos) << o.out;
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(o.out.find(fmt::format("round=1 elastic=1 max=2/2 rank={}", r)), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("round=2"), std::string::npos) << o.out;
  expect_all_gone(printed_pids(o.out));
}

TEST(Launch, RestartsAreBoundedAndTheLastFailureIsNamed) {
  // Rank 2 fails in every round: 1 + 2 rounds, then the launcher gives up with rank 2's exit code.
  const char* cmd = "echo pid $$; echo start round=$TRIDENT_RESTART_COUNT rank=$RANK; "
                    "if [ $RANK = 2 ]; then exit 3; fi; exec sleep 60";
  Outcome o = run_launch({"-n", "3", "--max-restarts", "2", "--master-port", "0", "--", "sh", "-c", cmd});
  ASSERT_TRUE(o.finished) << o.err;
  EXPECT_EQ(o.exit_code, 3) << o.err;
  EXPECT_NE(o.err.find("(restart 1 of 2)"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("(restart 2 of 2)"), std::string::npos) << o.err;
  EXPECT_EQ(o.err.find("(restart 3 of 2)"), std::string::npos) << o.err;
  std::vector<std::string> reports;
  for (const auto& line : split_lines(o.err))
    if (line.rfind("trident launch: rank 2 (pid ", 0) == 0) reports.push_back(line);
  ASSERT_EQ(reports.size(), 3u) << o.err;
  EXPECT_NE(reports.back().find("exited with code 3; stopped the other 2 ranks; no restart left (--max-restarts 2: "
                                "restarted 2 times)"),
            std::string::npos)
      << o.err;
  for (int round = 0; round < 3; ++round)
    EXPECT_NE(o.out.find(fmt::format("start round={} rank=2", round)), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("start round=3"), std::string::npos) << o.out;
  expect_all_gone(printed_pids(o.out));
  // Without --max-restarts the first failure ends the job, as before.
  Outcome once = run_launch({"-n", "2", "--master-port", "0", "--", "sh", "-c", "exit 4"});
  EXPECT_EQ(once.exit_code, 4) << once.err;
  EXPECT_EQ(once.err.find("restart"), std::string::npos) << once.err;
}

TEST(Launch, BadMaxRestartsIsAClearError) {
  Outcome neg = run_launch({"--max-restarts", "-1", "--", "true"});
  EXPECT_NE(neg.exit_code, 0);
  EXPECT_NE(neg.err.find("--max-restarts -1: must be >= 0"), std::string::npos) << neg.err;
  Outcome join = run_launch({"--join-timeout", "0", "--max-restarts", "1", "--", "true"});
  EXPECT_NE(join.exit_code, 0);
  EXPECT_NE(join.err.find("--join-timeout 0: must be > 0 seconds"), std::string::npos) << join.err;
  EXPECT_EQ(neg.out + join.out, "");
}

// --- A rank that is a real store client: this test binary re-executed under the launcher. ---

std::string cli_self_exe() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return {};
  return std::string(buf, static_cast<size_t>(n));
}

TEST(Launch, RanksReachTheLauncherHostedStoreWithTheirToken) {
  Outcome o = run_launch({"-n", "3", "--master-port", "0", "--", cli_self_exe(),
                          "--gtest_also_run_disabled_tests", "--gtest_filter=LaunchChildProcess.DISABLED_StoreClient"},
                         {"TRIDENT_LAUNCH_TEST_CHILD=store"});
  ASSERT_TRUE(o.finished) << o.err;
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(o.out.find("store-ok rank=" + std::to_string(r) + " world=3 sum=3"), std::string::npos) << o.out;
  }
}

TEST(Launch, EachRestartRoundRendezvousesInAFreshStoreNamespace) {
  // Every rank counts itself in under the same key in each round; rank 1 fails after round 0 is complete.
  // Round 1 must count 3, not 6: the keys of round 0 are not visible to it.
  Outcome o = run_launch({"-n", "3", "--max-restarts", "1", "--master-port", "0", "--", cli_self_exe(),
                          "--gtest_also_run_disabled_tests", "--gtest_filter=LaunchChildProcess.DISABLED_StoreClient"},
                         {"TRIDENT_LAUNCH_TEST_CHILD=rounds"});
  ASSERT_TRUE(o.finished) << o.err;
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  for (int round = 0; round < 2; ++round)
    for (int r = 0; r < 3; ++r)
      EXPECT_NE(o.out.find(fmt::format("rounds round={} rank={} joined=3", round, r)), std::string::npos) << o.out;
  EXPECT_NE(o.err.find("restart 1 of 1"), std::string::npos) << o.err;
}

TEST(Launch, StoreRefusesAWrongToken) {
  Outcome o = run_launch({"-n", "2", "--master-port", "0", "--", cli_self_exe(),
                          "--gtest_also_run_disabled_tests", "--gtest_filter=LaunchChildProcess.DISABLED_StoreClient"},
                         {"TRIDENT_LAUNCH_TEST_CHILD=badtoken"});
  ASSERT_TRUE(o.finished) << o.err;
  ASSERT_EQ(o.exit_code, 0) << o.out << o.err;
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(o.out.find("store-refused rank=" + std::to_string(r)), std::string::npos) << o.out;
  }
}

TEST(Launch, PortInUseIsAClearError) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string port = std::to_string(ntohs(a.sin_port));
  Outcome o = run_launch({"-n", "1", "--master-port", port, "--", "echo", "ran"});
  ::close(fd);
  ASSERT_TRUE(o.finished);
  EXPECT_NE(o.exit_code, 0);
  EXPECT_EQ(o.out, "") << "no rank may start without its store";
  EXPECT_NE(o.err.find("cannot host the rendezvous store on 127.0.0.1:" + port), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("choose another --master-port"), std::string::npos) << o.err;
}

TEST(Launch, TwoNodesRendezvousThroughNodeZerosStore) {
  // Two launchers on this host play node 0 and node 1 of one job; their 4 ranks meet in node 0's store.
  trident::testing::TempDir dir("launch-port");
  const std::string port_file = (dir.path / "port").string();
  const std::vector<std::string> env = make_env(kLaunchVars, {"TRIDENT_LAUNCH_TEST_CHILD=store",
                                                              "TRIDENT_STORE_TOKEN=two-node-secret"});
  auto node = [&](int node_rank, const std::string& port, std::vector<std::string> extra) {
    std::vector<std::string> args = {"-n", "2", "--nnodes", "2", "--node-rank", std::to_string(node_rank),
                                     "--master-addr", "127.0.0.1", "--master-port", port};
    args.insert(args.end(), extra.begin(), extra.end());
    for (std::string a : {std::string("--"), cli_self_exe(), std::string("--gtest_also_run_disabled_tests"),
                          std::string("--gtest_filter=LaunchChildProcess.DISABLED_StoreClient")}) {
      args.push_back(a);
    }
    return launch_argv(args);
  };
  ProcessRunner node0(node(0, "0", {"--port-file", port_file}), env);
  const int port = port_written_by(node0, port_file);
  ASSERT_GT(port, 0) << "node 0 wrote no port to " << port_file << ": " << node0.err();
  ProcessRunner node1(node(1, std::to_string(port), {}), env);
  auto s0 = node0.wait(kCliHangGuard);
  auto s1 = node1.wait(kCliHangGuard);
  ASSERT_TRUE(s0 && s1) << node0.err() << node1.err();
  EXPECT_EQ(*s0, 0) << node0.out() << node0.err();
  EXPECT_EQ(*s1, 0) << node1.out() << node1.err();
  for (int r : {0, 1}) EXPECT_NE(node0.out().find(fmt::format("store-ok rank={} world=4 sum=4", r)), std::string::npos);
  for (int r : {2, 3}) EXPECT_NE(node1.out().find(fmt::format("store-ok rank={} world=4 sum=4", r)), std::string::npos);
}

TEST(Launch, FailureOnOneNodeStopsTheOtherNode) {
  trident::testing::TempDir dir("launch-port");
  const std::string port_file = (dir.path / "port").string();
  const std::vector<std::string> env = make_env(kLaunchVars, {"TRIDENT_STORE_TOKEN=two-node-secret"});
  const char* cmd = "echo pid $$; if [ $RANK = 3 ]; then sleep 0.2; echo rank3-gives-up; exit 3; fi; exec sleep 60";
  auto node = [&](int node_rank, const std::string& port, std::vector<std::string> extra) {
    std::vector<std::string> args = {"-n", "2", "--nnodes", "2", "--node-rank", std::to_string(node_rank),
                                     "--master-port", port};
    args.insert(args.end(), extra.begin(), extra.end());
    for (const char* a : {"--", "sh", "-c", cmd}) args.push_back(a);
    return launch_argv(args);
  };
  ProcessRunner node0(node(0, "0", {"--port-file", port_file}), env);
  const int port = port_written_by(node0, port_file);
  ASSERT_GT(port, 0) << "node 0 wrote no port to " << port_file << ": " << node0.err();
  ProcessRunner node1(node(1, std::to_string(port), {}), env);
  auto s1 = node1.wait(kCliHangGuard);
  auto s0 = node0.wait(kCliHangGuard);
  ASSERT_TRUE(s0 && s1) << "a node kept running after the other failed:\n" << node0.err() << node1.err();
  ASSERT_TRUE(WIFEXITED(*s0) && WIFEXITED(*s1));
  EXPECT_EQ(WEXITSTATUS(*s1), 3) << node1.err();
  EXPECT_NE(node1.err().find("trident launch: rank 3 (pid "), std::string::npos) << node1.err();
  EXPECT_EQ(WEXITSTATUS(*s0), 1) << node0.err();
  const std::string report = line_starting(node0.err(), "trident launch: node 0 stopped 2 ranks because node 1: rank 3");
  EXPECT_FALSE(report.empty()) << node0.err();
  EXPECT_NE(report.find("exited with code 3"), std::string::npos) << report;
  expect_all_gone(printed_pids(node0.out()));
  expect_all_gone(printed_pids(node1.out()));
}

// Runs only as a rank started by the tests above (disabled, so a normal test run neither runs nor skips it).
TEST(LaunchChildProcess, DISABLED_StoreClient) {
  const std::string mode = trident::env::param_string("TRIDENT_LAUNCH_TEST_CHILD");
  ASSERT_FALSE(mode.empty()) << "runs only as a rank under `trident launch` (TRIDENT_LAUNCH_TEST_CHILD set)";
  const std::string addr = std::getenv("MASTER_ADDR");
  const int port = std::stoi(std::getenv("MASTER_PORT"));
  const std::string token = trident::env::store_token();
  const int rank = std::stoi(std::getenv("RANK"));
  const int world = std::stoi(std::getenv("WORLD_SIZE"));
  ASSERT_TRUE(trident::env::store_hosted());
  ASSERT_GT(port, 0);
  if (std::string(mode) == "badtoken") {
    EXPECT_THROW(trident::TCPStore(addr, port, token + "-wrong", trident::Seconds(5.0)), trident::StoreError);
    std::printf("store-refused rank=%d\n", rank);
    return;
  }
  if (mode == "rounds") {
    // Through connect_store, as every rank's process group rendezvouses.
    auto store = trident::connect_store(trident::rendezvous_from_env(), trident::Seconds(20.0));
    const int round = trident::env::restart_count();
    store->add("joined", 1);
    int64_t joined = store->add("joined", 0);
    while (joined < world) {
      ::usleep(10000);
      joined = store->add("joined", 0);
    }
    std::printf("rounds round=%d rank=%d joined=%lld\n", round, rank, static_cast<long long>(joined));
    std::fflush(stdout);
    if (round == 0 && rank == 1) {
      while (store->add("printed", 0) < world - 1) ::usleep(10000);  // the others have reported round 0
      std::_Exit(5);
    }
    store->add("printed", 1);
    if (round == 0) ::sleep(60);  // stopped by the launcher
    return;
  }
  trident::TCPStore store(addr, port, token, trident::Seconds(20.0));
  store.set_string("rank/" + std::to_string(rank), std::to_string(rank * 10));
  store.add("joined", 1);
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back("rank/" + std::to_string(r));
  store.wait(keys);
  for (int r = 0; r < world; ++r) EXPECT_EQ(store.get_string("rank/" + std::to_string(r)), std::to_string(r * 10));
  // Everyone joined the same server: the counter reaches the world size.
  int64_t sum = store.add("joined", 0);
  while (sum < world) {
    ::usleep(10000);
    sum = store.add("joined", 0);
  }
  std::printf("store-ok rank=%d world=%d sum=%lld\n", rank, world, static_cast<long long>(sum));
}

}  // namespace
