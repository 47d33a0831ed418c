// `trident launch`: parses flags, then calls trident::launch::launch (the logic lives in the library).
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "trident/launch/launcher.h"

namespace cmd_launch {
namespace {

void setup(CLI::App& app) {
  auto opts = std::make_shared<trident::launch::LaunchOptions>();
  CLI::App* sub = app.add_subcommand(
      "launch", "start N ranks of a command on this node (like torchrun); the first failing rank stops them all");
  sub->footer(
      "Form: trident launch -n N [options] -- COMMAND [ARGS...]\n"
      "Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,\n"
      "TRIDENT_STORE_TOKEN (random unless set; with --nnodes > 1 export the same one on every node) and\n"
      "TRIDENT_STORE_HOSTED=1: the launcher of node 0 hosts the rendezvous store.\n"
      "Exit status: 0 if every rank exits 0; else the first failed rank's exit code (128+N if signal N killed\n"
      "it); 128+N when the launcher gets signal N; 1 when another node failed; 127 if COMMAND cannot run.\n"
      "--bind (or TRIDENT_BIND) sets each rank's CPU affinity before it starts; auto is the default.\n"
      "--max-restarts N: when a rank fails on any node, every node stops its ranks and, once all nodes have\n"
      "rejoined (--join-timeout), starts them again, up to N times for the job (each round's ranks get\n"
      "TRIDENT_RESTART_COUNT / TORCHELASTIC_RESTART_COUNT and a fresh store namespace).");
  sub->add_option("-n,--nproc-per-node,--nproc", opts->nproc_per_node, "processes (ranks) on this node")
      ->capture_default_str();
  sub->add_option("--nnodes", opts->nnodes, "number of nodes")->capture_default_str();
  sub->add_option("--node-rank", opts->node_rank, "this node's rank in [0, nnodes)")->capture_default_str();
  sub->add_option("--master-addr", opts->master_addr, "address of node 0 (hosts the store)")
      ->capture_default_str();
  sub->add_option("--master-port", opts->master_port, "store port on node 0 (0 picks a free one)")
      ->capture_default_str();
  sub->add_option("--port-file", opts->port_file,
                  "node 0 writes the store's port to this file once it listens (with --master-port 0, how the "
                  "other nodes learn the port)");
  sub->add_flag("--tag-output", opts->tag_output, "prefix every output line with [rank R]");
  auto bind = std::make_shared<std::string>();
  sub->add_option("--bind", *bind,
                  "CPU binding of local ranks: none | core (rank i on the i-th allowed CPU, round-robin) | auto "
                  "(a share of the allowed CPUs each when ranks <= CPUs, else none); default TRIDENT_BIND, else auto");
  sub->add_option("--max-restarts,--max_restarts", opts->max_restarts,
                  "restart every rank of every node up to N times after a rank fails (all nodes restart together)")
      ->capture_default_str();
  auto join_timeout = std::make_shared<double>(0);
  sub->add_option("--join-timeout", *join_timeout,
                  "seconds every node's launcher may take to join the job and each restart round (default "
                  "TRIDENT_TIMEOUT); a node missing after that is named and the job stops");
  sub->add_option("--flight-recorder-dir", opts->flight_recorder_dir,
                  "the job's folder of flight-recorder dumps: every rank gets TRIDENT_FLIGHT_RECORDER_DIR=DIR "
                  "(created), so a hang or failure leaves all ranks' dumps there for `trident inspect DIR`");
  sub->add_option("--grace-period", opts->grace_seconds, "seconds between SIGTERM and SIGKILL when stopping ranks")
      ->capture_default_str();
  // The command is everything after "--", or everything from the first argument that is not an option.
  // CLI11 (2.1) hands the arguments after "--" back to the parent app unless the subcommand still has a
  // positional to fill, and prefix_command() applies only when no positional takes the first argument. So:
  // a positional "command" that accepts values only once "--" was seen (it is then the first of
  // remaining()), and prefix_command() for the form without "--".
  auto command = std::make_shared<std::vector<std::string>>();
  sub->prefix_command();
  sub->validate_positionals();
  sub->add_option("command", *command, "program and arguments to run once per rank (after --)")
      ->allow_extra_args()
      ->check(CLI::Validator(
          [sub](std::string&) -> std::string {
            auto rest = sub->remaining(false);
            return !rest.empty() && rest.front() == "--" ? std::string() : std::string("not after --");
          },
          "", "after --"));
  sub->callback([opts, sub, command, bind, join_timeout] {
    if (!bind->empty()) opts->bind = trident::launch::parse_bind(*bind);
    if (sub->count("--join-timeout") > 0) opts->join_timeout_seconds = *join_timeout;
    std::vector<std::string> rest = sub->remaining(false);
    if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
    opts->command = *command;
    opts->command.insert(opts->command.end(), rest.begin(), rest.end());
    trident::cli::set_exit_code(trident::launch::launch(*opts));
  });
}

trident::cli::CommandRegistration reg(10, setup);

}  // namespace
}  // namespace cmd_launch
