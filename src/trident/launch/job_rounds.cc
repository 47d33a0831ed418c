#include "trident/launch/job_rounds.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "trident/core/error.h"
#include "trident/core/log.h"

namespace trident::launch {
namespace {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void print_round_line(const std::string& text) {
  std::string line = text + "\n";
  std::fflush(stdout);
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
}

std::string node_key(int node) { return fmt::format("node{}", node); }

}  // namespace

std::string node_list(const std::vector<int>& nodes) {
  std::string out;
  const size_t shown = std::min<size_t>(nodes.size(), 16);
  for (size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + std::to_string(nodes[i]);
  if (shown < nodes.size()) out += fmt::format(", ... ({} nodes)", nodes.size());
  return out;
}

JobRounds::JobRounds(RoundsOptions options, Connect connect)
    : o_(std::move(options)), connect_(std::move(connect)), hosts_(static_cast<size_t>(o_.nnodes)) {}

std::string JobRounds::key(int round, const std::string& what) {
  return fmt::format("trident_launch/round{}/{}", round, what);
}

Store& JobRounds::store(double timeout) {
  if (!store_) store_ = connect_(timeout);
  return *store_;
}

std::string JobRounds::node_name(int node) {
  auto& host = hosts_.at(static_cast<size_t>(node));
  if (host.empty() && store_) {
    try {
      if (store_->check({key(0, node_key(node))})) host = store_->get_string(key(0, node_key(node)));
    } catch (const Error&) {
      store_.reset();
    }
  }
  return host.empty() ? fmt::format("node {}", node) : fmt::format("node {} (host {})", node, host);
}

std::vector<int> JobRounds::absent(int round, const std::string& what) {
  std::vector<int> out;
  for (int k = 0; k < o_.nnodes; ++k) {
    try {
      if (store_ && store_->check({key(round, what + std::to_string(k))})) continue;
    } catch (const Error&) {
      store_.reset();
    }
    out.push_back(k);
  }
  return out;
}

std::string JobRounds::join(int round) {
  const double start = steady_seconds();
  const double deadline = start + o_.join_timeout;
  std::vector<std::string> everyone;
  for (int k = 0; k < o_.nnodes; ++k) everyone.push_back(key(round, node_key(k)));
  bool marked = false;
  bool reached = false;  // the store answered during this join
  bool told = false;
  std::string last_error;
  for (;;) {
    try {
      // Round 0's connection waits for node 0's store up to the whole deadline (the store may start later);
      // later rounds retry in short attempts, since a request that fails drops the client.
      Store& s = store(round == 0 ? o_.join_timeout : std::clamp(deadline - steady_seconds(), 0.1, 5.0));
      if (!marked) {
        s.set_string(key(round, node_key(o_.node_rank)), o_.host);  // idempotent: safe to repeat after a break
        marked = true;
      }
      reached = true;
      if (s.check({kAbortKey})) return s.get_string(kAbortKey);
      if (s.check(everyone)) {
        log_debug("launch", "trident launch: node {}: all {} nodes joined round {}", o_.node_rank, o_.nnodes, round);
        return {};
      }
    } catch (const Error& e) {
      if (round == 0 && !reached) throw;  // the first connection: a wrong address or token fails at once
      last_error = e.what();
      store_.reset();
    }
    const double now = steady_seconds();
    if (now >= deadline) {
      if (!store_) {
        TRIDENT_THROW(StoreError,
                      "node {} could not reach {} to join restart round {} within {:.0f} s: {}; is node 0's launcher "
                      "running and its address reachable from here? (--join-timeout sets the wait)",
                      o_.node_rank, o_.store_where, round, o_.join_timeout, last_error);
      }
      const std::vector<int> missing = absent(round, "node");
      std::string names;
      for (int k : missing) names += (names.empty() ? "" : ", ") + node_name(k);
      const std::string why =
          fmt::format("{} did not join {} within {:.0f} s", names.empty() ? "a node" : names,
                      round == 0 ? "the job" : fmt::format("restart round {}", round), o_.join_timeout);
      publish_abort(why);
      throw TimeoutError(
          detail::with_location(
              fmt::format("node {}: {}; start or fix the missing node's launcher (same --nnodes, --master-addr, "
                          "--master-port and TRIDENT_STORE_TOKEN), or raise --join-timeout",
                          o_.node_rank, why),
              __FILE__, __LINE__),
          o_.node_rank, "launch rendezvous", round, missing);
    }
    if (!told && now - start >= std::min(5.0, o_.join_timeout / 2)) {
      told = true;
      const std::string what = round == 0 ? "the job" : fmt::format("restart round {}", round);
      if (!store_) {
        print_round_line(fmt::format("trident launch: node {} cannot reach {} yet ({}); retrying for up to {:.0f} s",
                                     o_.node_rank, o_.store_where, last_error, deadline - now));
      } else {
        std::string names;
        for (int k : absent(round, "node")) names += (names.empty() ? "" : ", ") + node_name(k);
        if (!names.empty()) {
          print_round_line(fmt::format("trident launch: node {} waiting for {} to join {} (up to {:.0f} s more)",
                                       o_.node_rank, names, what, deadline - now));
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(o_.poll_seconds));
  }
}

RoundFailure JobRounds::failure(int round) {
  try {
    Store& s = store(o_.request_timeout);
    if (s.check({kAbortKey})) return {s.get_string(kAbortKey), true};
    for (const char* what : {"killed", "failed"}) {
      const std::string k = key(round, what);
      if (s.check({k})) return {s.get_string(k), false};
    }
    return {};
  } catch (const Error& e) {
    store_.reset();
    TRIDENT_THROW(StoreError, "{} is gone ({})", o_.store_where, e.what());
  }
}

void JobRounds::publish_failure(int round, const std::string& what, bool killed) {
  try {
    const std::string text = fmt::format("node {}: {}", o_.node_rank, what);
    const Bytes value(text.begin(), text.end());
    Store& s = store(o_.request_timeout);
    s.compare_set(key(round, "failed"), {}, value);
    if (killed) s.compare_set(key(round, "killed"), {}, value);
  } catch (const Error& e) {
    store_.reset();
    log_warn("trident launch: could not tell the other nodes about the failure: {}", e.what());
  }
}

void JobRounds::publish_abort(const std::string& what) {
  try {
    const std::string text = fmt::format("node {}: {}", o_.node_rank, what);
    store(o_.request_timeout).compare_set(kAbortKey, {}, Bytes(text.begin(), text.end()));
  } catch (const Error& e) {
    store_.reset();
    log_warn("trident launch: could not tell the other nodes that the job stops: {}", e.what());
  }
}

RoundFailure JobRounds::await_success(int round, double timeout, std::vector<int>* unfinished) {
  const double deadline = steady_seconds() + timeout;
  std::vector<std::string> everyone;
  for (int k = 0; k < o_.nnodes; ++k) everyone.push_back(key(round, "ok/" + node_key(k)));
  bool marked = false;
  std::string last_error;
  for (;;) {
    try {
      Store& s = store(std::clamp(deadline - steady_seconds(), 0.1, 5.0));
      if (!marked) {
        s.set_string(key(round, "ok/" + node_key(o_.node_rank)), o_.host);
        marked = true;
      }
      if (s.check(everyone)) return {};
      RoundFailure f = failure(round);
      if (!f.why.empty()) return f;
    } catch (const Error& e) {
      last_error = e.what();
      store_.reset();
    }
    if (steady_seconds() >= deadline) {
      if (unfinished) *unfinished = absent(round, "ok/node");
      if (!last_error.empty()) log_warn("trident launch: {}", last_error);
      return {};
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(o_.poll_seconds));
  }
}

}  // namespace trident::launch
