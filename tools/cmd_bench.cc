// `trident bench comm`: parses flags, then calls trident::bench::run_comm_bench (the logic lives in the
// library). Runs as one rank of a job started by `trident launch` (or torchrun, mpirun, Slurm), or by
// itself with --nproc N, when it starts N local copies of itself through the launcher library.
//
// Exit status: 0 when every row ran (and, with --check, every element was right); 1 when an element was
// wrong or a collective failed; 2 for a bad flag; with --nproc, the launcher's status (the first failed
// rank's).
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "command.h"
#include "trident/bench/bench_page.h"
#include "trident/bench/comm_bench.h"
#include "trident/comm/process_group.h"
#include "trident/core/env.h"
#include "trident/core/error.h"
#include "trident/dashboard/page_file.h"
#include "trident/launch/launcher.h"

namespace cmd_bench {
namespace {

struct RawFlags {
  std::vector<std::string> child_args;  // with --nproc: the ranks' command line after "bench comm"
  std::string op = "all_reduce";
  std::string minbytes = "8";
  std::string maxbytes = "64M";
  std::string stepfactor = "2";
  int iters = 20;
  int warmup = 5;
  std::string dtype = "float32";
  std::string redop = "sum";
  int root = 0;
  std::string algo = "auto";
  std::string transport = "auto";
  std::string backend = "native";
  bool check = false;
  std::string json;
  bool inplace = false;
  bool outofplace = false;
  std::string buffers = "ordinary";
  std::string device = "cpu";
  std::string timeout;
  int nproc = 0;
  std::string bind;  // --bind with --nproc ("" = TRIDENT_BIND, else auto)
  std::string tune;
  std::string html;                // --html FILE: the busbw page (rank 0 writes it)
  std::vector<std::string> peers;  // --peer LABEL=FILE: results overlaid on it
  // Flags given on the command line (with --tune, the others take --tune's defaults).
  bool given_op = false, given_minbytes = false, given_maxbytes = false, given_stepfactor = false,
       given_iters = false, given_warmup = false, given_algo = false, given_placement = false;
};

using trident::InvalidArgument;

trident::bench::CommBenchOptions to_options(const RawFlags& f) {
  trident::bench::CommBenchOptions o;
  o.ops = trident::bench::parse_ops(f.op, "--op");
  o.min_bytes = trident::env::parse_size(f.minbytes, "-b/--minbytes");
  o.max_bytes = trident::env::parse_size(f.maxbytes, "-e/--maxbytes");
  {
    char* end = nullptr;
    long long v = std::strtoll(f.stepfactor.c_str(), &end, 10);
    if (f.stepfactor.empty() || *end != '\0')
      TRIDENT_THROW(InvalidArgument, "-f/--stepfactor '{}' is not an integer; give a factor >= 2 (e.g. -f 2)",
                    f.stepfactor);
    o.step_factor = v;
  }
  o.iters = f.iters;
  o.warmup = f.warmup;
  try {
    o.dtype = trident::parse_dtype(f.dtype);
  } catch (const InvalidArgument&) {
    TRIDENT_THROW(InvalidArgument,
                  "--dtype '{}' is not a dtype; use float32, float64, bfloat16, float16, int32, int64 or uint8",
                  f.dtype);
  }
  try {
    o.redop = trident::parse_reduce_op(f.redop);
  } catch (const InvalidArgument&) {
    TRIDENT_THROW(InvalidArgument, "--redop '{}' is not a reduce op; use sum, avg, max, min or prod", f.redop);
  }
  o.root = f.root;
  o.algos = trident::bench::parse_algos(f.algo, &o.algo_all, "--algo");
  o.transport = f.transport;
  o.check = f.check;
  o.json_path = f.json;
  o.buffers = f.buffers;
  o.device = f.device;
  // Default: both placements, as nccl-tests prints both; either flag alone selects that one.
  if (f.inplace || f.outofplace) {
    o.inplace = f.inplace;
    o.outofplace = f.outofplace;
  }
  if (!f.timeout.empty()) o.timeout_s = trident::env::parse_seconds(f.timeout, "--timeout");
  if (!f.tune.empty()) {
    // --tune: its own defaults (every op with a choice, every algorithm), then the flags the user gave.
    trident::bench::CommBenchOptions t = o;
    trident::bench::apply_tune_defaults(t);
    if (f.given_op) t.ops = o.ops;
    if (f.given_minbytes) t.min_bytes = o.min_bytes;
    if (f.given_maxbytes) t.max_bytes = o.max_bytes;
    if (f.given_stepfactor) t.step_factor = o.step_factor;
    if (f.given_iters) t.iters = o.iters;
    if (f.given_warmup) t.warmup = o.warmup;
    if (f.given_algo) t.algos = o.algos, t.algo_all = o.algo_all;
    if (f.given_placement) t.inplace = o.inplace, t.outofplace = o.outofplace;
    t.tune_path = f.tune;
    o = t;
  }
  return o;
}

// The options this process was given, as CLI11 parsed them, without --nproc and --bind: the command line of
// the copies --nproc starts.
std::vector<std::string> child_arguments(const CLI::App& comm) {
  std::vector<std::string> out;
  for (const CLI::Option* opt : comm.get_options()) {
    const std::string name = opt->get_name();
    if (opt->count() == 0 || name == "--nproc" || name == "--bind" || name == "--help") continue;
    if (opt->get_expected_min() == 0) {  // a flag: once per occurrence
      for (size_t k = 0; k < opt->count(); ++k) out.push_back(name);
      continue;
    }
    for (const std::string& v : opt->results()) out.push_back(name + "=" + v);
  }
  return out;
}

std::string self_exe() {
  char buf[4096];
  ssize_t len = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (len <= 0) TRIDENT_THROW(trident::IoError, "bench comm --nproc: cannot find this program (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(len));
}

// Rank 0's --html page: this run's busbw per collective and algorithm, with the --peer files' lines.
void write_page(const RawFlags& f, const trident::bench::CommBenchResult& r) {
  std::vector<trident::bench::BusbwSource> sources = {trident::bench::busbw_source("trident", r.records)};
  for (const std::string& p : f.peers) sources.push_back(trident::bench::load_busbw_source(p, "--peer"));
  std::string subtitle;
  if (!r.records.empty()) {
    const auto& first = r.records.front();
    subtitle = std::to_string(first.world_size) + " ranks over " + first.transport + ", " + f.dtype + " " + f.redop +
               ", " + first.buffers + " buffers";
  }
  const std::string html = trident::dashboard::render_figures(trident::bench::busbw_figures(sources, subtitle));
  trident::dashboard::write_html_file(f.html, html, "bench comm --html");
  std::cout << "# busbw page written: " << f.html << "\n";
}

int run(const RawFlags& f) {
  trident::bench::CommBenchOptions o;
  std::optional<trident::launch::Bind> bind;
  try {
    o = to_options(f);
    if (!f.bind.empty()) {
      TRIDENT_CHECK(f.nproc > 0, InvalidArgument,
                    "--bind {} applies to the ranks --nproc starts; under another launcher use its binding "
                    "(trident launch --bind, mpirun --bind-to)",
                    f.bind);
      bind = trident::launch::parse_bind(f.bind);
    }
    if (f.backend != "native" && f.backend != "mpi" && f.backend != "nccl")
      TRIDENT_THROW(InvalidArgument, "--backend '{}' is not one of native, mpi, nccl", f.backend);
    if (f.backend == "nccl" && f.device != "cuda")
      TRIDENT_THROW(InvalidArgument, "--backend nccl reduces GPU memory: add --device cuda (one GPU per rank)");
    if (f.backend == "mpi" && f.nproc > 0)
      TRIDENT_THROW(InvalidArgument, "--backend mpi takes its ranks from mpirun: run `mpirun -np N trident bench comm "
                    "--backend mpi ...` without --nproc");
    if (f.nproc < 0) TRIDENT_THROW(InvalidArgument, "--nproc must be at least 1, got {}", f.nproc);
    // The page's path and the peers' files are checked before the run, not found wrong after it.
    if (!f.peers.empty() && f.html.empty())
      TRIDENT_THROW(InvalidArgument, "--peer overlays results on the --html page: add --html FILE");
    if (!f.html.empty()) trident::dashboard::check_html_path(f.html, "--html");
    for (const std::string& p : f.peers) trident::bench::load_busbw_source(p, "--peer");
    if (f.nproc > 0) {
      if (trident::launch::in_launched_job())
        TRIDENT_THROW(InvalidArgument,
                      "--nproc {} starts its own ranks, but this process is already a rank of a launched job (RANK "
                      "is set); drop --nproc under trident launch",
                      f.nproc);
      trident::bench::validate(o, f.nproc);
    }
  } catch (const trident::Error& e) {
    std::fprintf(stderr, "trident bench comm: error: %s\n", e.what());
    return 2;
  }
  if (f.nproc > 0) {
    trident::launch::LaunchOptions lo;
    lo.nproc_per_node = f.nproc;
    lo.master_addr = "127.0.0.1";
    lo.master_port = 0;
    lo.bind = bind;
    lo.command = {self_exe(), "bench", "comm"};
    for (auto& a : f.child_args) lo.command.push_back(a);
    std::fflush(stdout);
    return trident::launch::launch(lo);
  }
  try {
    trident::GroupOptions g;
    g.transport = o.transport;
    g.backend = f.backend;
    if (o.timeout_s) g.timeout = trident::Seconds(*o.timeout_s);
    auto pg = trident::init_process_group(g);
    trident::bench::CommBenchResult r = trident::bench::run_comm_bench(*pg, o, std::cout);
    if (pg->rank() == 0 && !f.html.empty()) write_page(f, r);
    std::cout.flush();
    if (r.wrong > 0) {
      std::fprintf(stderr, "trident bench comm: rank %d: %llu wrong elements (see #wrong)\n", pg->rank(),
                   static_cast<unsigned long long>(r.wrong));
      return 1;
    }
    return 0;
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "trident bench comm: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trident bench comm: failed: %s\n", e.what());
    return 1;
  }
}

void setup(CLI::App& app) {
  CLI::App* bench = app.add_subcommand(
      "bench", "Benchmarks: `bench comm` measures collectives (nccl-tests style), `bench kernels` the CPU kernels");
  bench->require_subcommand(1);
  auto f = std::make_shared<RawFlags>();
  CLI::App* comm = bench->add_subcommand(
      "comm",
      "Collective benchmark in nccl-tests' terms: size, count, type, redop, root, then per out-of-place/in-place "
      "run time (us), algbw and busbw (GB/s, 1 GB = 1e9 B), #wrong and latency min/p50/p99.\n"
      "Run as: trident launch -n N -- trident bench comm [flags], or trident bench comm --nproc N [flags]");
  comm->add_option("--op", f->op,
                   "collective(s): broadcast, reduce, all_reduce, gather, scatter, all_gather, reduce_scatter, "
                   "all_to_all, barrier, or all; comma-separated lists accepted")
      ->capture_default_str();
  comm->add_option("-b,--minbytes", f->minbytes, "smallest size (bytes; K/M/G suffixes, powers of 1024)")
      ->capture_default_str();
  comm->add_option("-e,--maxbytes", f->maxbytes, "largest size (bytes; K/M/G suffixes)")->capture_default_str();
  comm->add_option("-f,--stepfactor", f->stepfactor, "multiply the size by this factor between rows (>= 2)")
      ->capture_default_str();
  comm->add_option("--iters,-n", f->iters, "timed iterations per row")->capture_default_str();
  comm->add_option("--warmup,-w", f->warmup, "untimed iterations before each row")->capture_default_str();
  comm->add_option("--dtype,-d", f->dtype, "float32, float64, bfloat16, float16, int32, int64, uint8")
      ->capture_default_str();
  comm->add_option("--redop,-o", f->redop, "sum, avg, max, min, prod")->capture_default_str();
  comm->add_option("--root,-r", f->root, "root rank of broadcast, reduce, gather, scatter")->capture_default_str();
  comm->add_option("--algo,-a", f->algo,
                   "auto, ring, rd, direct, tree, dissemination, pairwise, rh, hier (comma list), or all: every "
                   "algorithm of each op, then auto")
      ->capture_default_str();
  comm->add_option("--transport", f->transport, "auto, shm or tcp")->capture_default_str();
  comm->add_option("--backend", f->backend,
                   "native (trident's algorithms and transports; device buffers staged through host memory), mpi (the "
                   "MPI library, under mpirun) or nccl (with --device cuda)")
      ->capture_default_str();
  comm->add_flag("--check,-c", f->check,
                 "verify every element of every iteration against an independently computed reference; exit 1 on "
                 "any wrong element");
  comm->add_option("--json", f->json, "write one JSON record per (row, placement) to FILE");
  comm->add_option("--html", f->html,
                   "write FILE: one self-contained HTML page of busbw against size per collective and algorithm "
                   "(opens offline), with the --peer results overlaid");
  comm->add_option("--peer", f->peers,
                   "LABEL=FILE: results to overlay on the --html page (a --json file of another run, OpenMPI's rows as "
                   "scripts/run_peers.sh writes them, or mpi_bench/gloo_bench's table); repeatable");
  comm->add_flag("--inplace", f->inplace, "run only the in-place form (default: both)");
  comm->add_flag("--outofplace", f->outofplace, "run only the out-of-place form (default: both)");
  comm->add_option("--device", f->device,
                   "cpu, or cuda: the buffers of the timed calls live in GPU memory (LOCAL_RANK picks the GPU)")
      ->capture_default_str();
  comm->add_option("--buffers", f->buffers,
                   "ordinary (private memory) or shared (the group's registered memory: zero copy on one host)")
      ->capture_default_str();
  comm->add_option("--timeout", f->timeout, "deadline of every collective (e.g. 30s, 2m; default TRIDENT_TIMEOUT)");
  comm->add_option("--nproc", f->nproc, "start N local ranks of this benchmark (like trident launch -n N)");
  comm->add_option("--bind", f->bind,
                   "with --nproc: CPU binding of the ranks, none|core|auto (as trident launch --bind; default "
                   "TRIDENT_BIND, else auto)");
  comm->add_option("--tune", f->tune,
                   "measure every algorithm of every collective that has a choice (8 B to 8 MiB by factors of 16, in "
                   "place, p50 latency) and write the tuning file FILE that TRIDENT_TUNING_FILE=FILE makes the "
                   "backend use; -b, -e, -f, -n, -w, --op, --algo override these defaults");
  comm->callback([f, comm] {
    f->given_op = comm->count("--op") > 0;
    f->given_minbytes = comm->count("--minbytes") > 0;
    f->given_maxbytes = comm->count("--maxbytes") > 0;
    f->given_stepfactor = comm->count("--stepfactor") > 0;
    f->given_iters = comm->count("--iters") > 0;
    f->given_warmup = comm->count("--warmup") > 0;
    f->given_algo = comm->count("--algo") > 0;
    f->given_placement = comm->count("--inplace") > 0 || comm->count("--outofplace") > 0;
    f->child_args = child_arguments(*comm);
    trident::cli::set_exit_code(run(*f));
  });
}

trident::cli::CommandRegistration reg(40, setup);

}  // namespace
}  // namespace cmd_bench
