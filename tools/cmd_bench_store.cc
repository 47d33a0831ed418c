// `trident bench store`: argument parsing; the benchmark itself is bench/store_bench.h.
#include <iostream>
#include <memory>

#include "command.h"
#include "trident/bench/store_bench.h"
#include "trident/core/error.h"

namespace trident::cli {
namespace cmd_bench_store {
namespace {

struct Flags {
  bench::StoreBenchOptions o;
  double timeout_s = 120;
  bool json = false;
};

void setup(CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");
  auto f = std::make_shared<Flags>();
  CLI::App* s = bench->add_subcommand(
      "store",
      "Store rendezvous under load: N clients (threads in P processes) each connect to one TCPStore, set a key, "
      "add to a shared counter, wait on a shared key, read another client's key and pass a barrier; prints the "
      "time, per-client connect and rendezvous latency, and checks that nothing was lost");
  s->add_option("--clients,-n", f->o.clients, "clients, each with its own connection")->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  s->add_option("--procs,-p", f->o.procs, "processes the clients are spread over (as threads)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  s->add_option("--stalled", f->o.stalled, "extra connections that send half a request and go quiet")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  s->add_option("--vanishing", f->o.vanishing, "extra connections that send half a wait request and hang up")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  s->add_option("--timeout", f->timeout_s, "seconds every client may take")->capture_default_str()
      ->check(CLI::PositiveNumber);
  s->add_flag("--json", f->json, "one JSON object instead of the table");
  s->callback([f] {
    f->o.timeout = Seconds(f->timeout_s);
    try {
      const bench::StoreBenchResult r = bench::run_store_bench(f->o);
      bench::print_store_bench(std::cout, r, f->json);
      set_exit_code(r.ok ? 0 : 1);
    } catch (const InvalidArgument& e) {
      std::cerr << "trident bench store: " << e.what() << "\n";
      set_exit_code(2);
    } catch (const std::exception& e) {
      std::cerr << "trident bench store: failed: " << e.what() << "\n";
      set_exit_code(1);
    }
  });
}

// After `bench` (cmd_bench.cc, order 40) exists.
CommandRegistration reg(42, setup);

}  // namespace
}  // namespace cmd_bench_store
}  // namespace trident::cli
