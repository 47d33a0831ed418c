// Supervisor (spawn and supervise N processes) and the launcher's pure helpers, in process.
#include "trident/launch/supervisor.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "trident/core/error.h"
#include "trident/launch/launcher.h"

namespace {

using trident::launch::ChildSpec;
using trident::launch::StreamKind;
using trident::launch::SuperviseOptions;
using trident::launch::Supervisor;

ChildSpec body(std::function<int()> fn) {
  ChildSpec spec;
  spec.body = std::move(fn);
  return spec;
}

struct Captured {
  std::map<int, std::vector<std::string>> out, err;
};

SuperviseOptions capturing(Captured& cap) {
  SuperviseOptions o;
  o.on_line = [&cap](int index, StreamKind kind, std::string_view line) {
    (kind == StreamKind::kStdout ? cap.out : cap.err)[index].emplace_back(line);
  };
  return o;
}

TEST(Supervisor, CollectsExitCodesAndOutputOfEveryChild) {
  Captured cap;
  Supervisor sup(capturing(cap));
  for (int i = 0; i < 4; ++i) {
    sup.spawn(body([i] {
      std::printf("hello %d\nsecond %d\n", i, i);
      std::fprintf(stderr, "warn %d", i);  // no newline: still a line
      return 0;
    }));
  }
  auto result = sup.run();
  ASSERT_TRUE(result.ok());
  ASSERT_EQ(result.children.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const auto& c = result.children[static_cast<size_t>(i)];
    EXPECT_TRUE(c.exited);
    EXPECT_EQ(c.exit_code, 0);
    EXPECT_FALSE(c.sent_stop);
    const auto s = std::to_string(i);
    EXPECT_EQ(cap.out[i], (std::vector<std::string>{"hello " + s, "second " + s}));
    EXPECT_EQ(cap.err[i], (std::vector<std::string>{"warn " + s}));
    EXPECT_EQ(c.tail.size(), 3u);
  }
}

TEST(Supervisor, TailKeepsTheLastLinesAndLongLinesSurvive) {
  Captured cap;
  SuperviseOptions o = capturing(cap);
  o.tail_lines = 20;
  Supervisor sup(o);
  const std::string long_line(200 * 1024, 'z');  // longer than one read and than the line cap
  sup.spawn(body([&long_line] {
    for (int k = 0; k < 50; ++k) std::printf("line %d\n", k);
    std::fputs(long_line.c_str(), stdout);
    std::fputs("\nlast", stdout);
    return 0;
  }));
  auto result = sup.run();
  ASSERT_TRUE(result.ok());
  std::string joined;
  const auto& lines = cap.out[0];
  ASSERT_GE(lines.size(), 52u);
  for (int k = 0; k < 50; ++k) EXPECT_EQ(lines[static_cast<size_t>(k)], "line " + std::to_string(k));
  for (size_t k = 50; k + 1 < lines.size(); ++k) joined += lines[k];
  EXPECT_EQ(joined, long_line) << "a long line may be split but never loses bytes";
  EXPECT_EQ(lines.back(), "last");
  const auto& tail = result.children[0].tail;
  ASSERT_EQ(tail.size(), 20u);
  for (size_t k = 0; k < 20; ++k) {
    // Kept lines are cut at 1 KiB.
    EXPECT_EQ(tail[k], lines[lines.size() - 20 + k].substr(0, 1024)) << k;
  }
  EXPECT_EQ(tail.back(), "last");
}

TEST(Supervisor, FirstFailureStopsTheOthers) {
  Captured cap;
  SuperviseOptions o = capturing(cap);
  o.grace_seconds = 5;
  Supervisor sup(o);
  sup.spawn(body([] {
    ::sleep(60);
    return 0;
  }));
  sup.spawn(body([] {
    std::printf("failing\n");
    return 5;
  }));
  sup.spawn(body([] {
    ::sleep(60);
    return 0;
  }));
  auto result = sup.run();
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.first_failure, 1);
  EXPECT_EQ(result.children[1].exit_code, 5);
  EXPECT_EQ(result.children[1].describe(), "exited with code 5");
  EXPECT_FALSE(result.children[1].sent_stop);
  for (size_t i : {0u, 2u}) {
    EXPECT_TRUE(result.children[i].sent_stop);
    EXPECT_FALSE(result.children[i].exited);
    EXPECT_EQ(result.children[i].term_signal, SIGTERM);
  }
  EXPECT_EQ(result.children[1].tail, std::deque<std::string>{"failing"});
}

// A rank killed by a signal (the OOM killer) while a peer, noticing, exits with an error first: the killed
// rank is the failure reported, not the peer that only reported it.
TEST(Supervisor, ASignalDeathIsTheCauseOverAPeerThatExitedFirst) {
  Captured cap;
  SuperviseOptions o = capturing(cap);
  o.grace_seconds = 5;
  Supervisor sup(o);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  sup.spawn(body([&ready] {
    char c;
    if (::read(ready[0], &c, 1) != 1) return 3;  // the victim ignores SIGTERM from here on
    std::printf("rank 1 died\n");
    return 1;  // the survivor: exits with an error naming the dead peer
  }));
  sup.spawn(body([&ready] {
    // The victim: still "running" when the supervisor reaps the survivor and sends SIGTERM (ignored here),
    // then killed by a signal nobody in the supervisor sent.
    ::signal(SIGTERM, SIG_IGN);
    if (::write(ready[1], "x", 1) != 1) return 3;
    ::usleep(300000);
    ::raise(SIGKILL);
    return 0;
  }));
  auto result = sup.run();
  ::close(ready[0]);
  ::close(ready[1]);
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.first_failure, 1);
  EXPECT_EQ(result.children[1].term_signal, SIGKILL);
  EXPECT_EQ(result.children[0].exit_code, 1);
}

TEST(Supervisor, TimeoutStopsAndEscalatesToSigkill) {
  SuperviseOptions o;
  o.timeout_seconds = 0.2;
  o.grace_seconds = 0.3;
  Supervisor sup(o);
  sup.spawn(body([] {
    std::signal(SIGTERM, SIG_IGN);
    for (;;) ::pause();
    return 0;
  }));
  sup.spawn(body([] {
    ::sleep(60);
    return 0;
  }));
  auto result = sup.run();
  EXPECT_TRUE(result.timed_out);
  EXPECT_EQ(result.first_failure, -1) << "children we stopped are not failures";
  EXPECT_EQ(result.children[0].term_signal, SIGKILL);
  EXPECT_EQ(result.children[0].describe(), "was killed by signal 9 (SIGKILL)");
  EXPECT_EQ(result.children[1].term_signal, SIGTERM);
}

TEST(Supervisor, ExecsProgramsWithTheGivenEnvironment) {
  Captured cap;
  Supervisor sup(capturing(cap));
  ChildSpec spec;
  spec.argv = {"sh", "-c", "echo $ONLY_THIS; echo ${HOME:-nohome}"};
  spec.env = {"ONLY_THIS=value-42", "PATH=/usr/bin:/bin"};
  sup.spawn(spec);
  auto result = sup.run();
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(cap.out[0], (std::vector<std::string>{"value-42", "nohome"}));
}

TEST(Supervisor, UnrunnableProgramThrows) {
  Supervisor sup;
  ChildSpec missing;
  missing.argv = {"/nonexistent/trident-test-prog"};
  EXPECT_THROW(sup.spawn(missing), trident::IoError);
  ChildSpec not_found;
  not_found.argv = {"trident-no-such-program"};
  not_found.env = {"PATH=/bin:/usr/bin"};
  EXPECT_THROW(sup.spawn(not_found), trident::IoError);
  EXPECT_EQ(sup.size(), 0u);
}

TEST(Supervisor, FindExecutableAndSignalNames) {
  using trident::launch::find_executable;
  EXPECT_EQ(find_executable("sh", "/nonexistent-dir:/bin"), "/bin/sh");
  EXPECT_EQ(find_executable("trident-no-such-program", "/bin:/usr/bin"), "");
  EXPECT_EQ(find_executable("./x", "/bin"), "./x");
  EXPECT_EQ(find_executable("", "/bin"), "");
  EXPECT_EQ(trident::launch::signal_name(SIGKILL), "SIGKILL");
  EXPECT_EQ(trident::launch::signal_name(SIGTERM), "SIGTERM");
}

TEST(Launcher, RankEnvironmentArithmetic) {
  trident::launch::LaunchOptions o;
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 29500);
  o.nproc_per_node = 4;
  o.nnodes = 3;
  o.node_rank = 1;
  std::map<std::string, std::string> env;
  for (auto& [k, v] : trident::launch::rank_environment(o, 3, 1234, "tok")) env[k] = v;
  EXPECT_EQ(env["RANK"], "7");
  EXPECT_EQ(env["WORLD_SIZE"], "12");
  EXPECT_EQ(env["LOCAL_RANK"], "3");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(env["GROUP_RANK"], "1");
  EXPECT_EQ(env["GROUP_WORLD_SIZE"], "3");
  EXPECT_EQ(env["MASTER_PORT"], "1234");
  EXPECT_EQ(env["TRIDENT_STORE_TOKEN"], "tok");
  EXPECT_EQ(env["TRIDENT_STORE_HOSTED"], "1");
}

TEST(Launcher, RandomTokensAre128BitHexAndDiffer) {
  const std::string a = trident::launch::random_token();
  const std::string b = trident::launch::random_token();
  EXPECT_EQ(a.size(), 32u);
  EXPECT_TRUE(std::all_of(a.begin(), a.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); }));
  EXPECT_NE(a, b);
}

TEST(Launcher, ValidateNamesTheBadOption) {
  trident::launch::LaunchOptions o;
  o.command = {"true"};
  EXPECT_NO_THROW(trident::launch::validate(o));
  auto bad = o;
  bad.nproc_per_node = 0;
  EXPECT_THROW(trident::launch::validate(bad), trident::InvalidArgument);
  bad = o;
  bad.nnodes = 2;
  bad.node_rank = 2;
  EXPECT_THROW(trident::launch::validate(bad), trident::InvalidArgument);
  bad = o;
  bad.command.clear();
  EXPECT_THROW(trident::launch::validate(bad), trident::InvalidArgument);
}

}  // namespace
