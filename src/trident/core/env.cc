#include "trident/core/env.h"

#include <cctype>
#include <cstdlib>
#include <string_view>

#include "trident/core/error.h"

namespace trident::env {

const std::vector<ParamInfo>& all_params() {
  // Never destroyed: threads that outlive static destructors read it (the flight recorder's dump thread
  // serving the launcher's SIGTERM while the main thread is in exit() after an error).
  static const auto* params = new std::vector<ParamInfo>{
      {"TRIDENT_LOG_LEVEL", "info", "debug|info|warn|error"},
      {"TRIDENT_DEBUG", "", "comma-separated subsystems to trace: comm,store,launch (or all)"},
      {"TRIDENT_TIMEOUT", "600", "default deadline of every blocking call, seconds (30, 500ms, 10m)"},
      {"TRIDENT_TRANSPORT", "auto", "auto (shm on one host, tcp across hosts) | shm | tcp"},
      {"TRIDENT_ALGO", "", "force one algorithm for every collective that has it (e.g. ring, rd, direct, tree)"},
      {"TRIDENT_STORE_TOKEN", "", "shared secret the store's clients must present (set by trident launch)"},
      {"TRIDENT_STORE_HOSTED", "0", "1 = the store server already runs at MASTER_ADDR:MASTER_PORT (set by trident launch)"},
      {"TRIDENT_RESTART_COUNT", "0",
       "how many times trident launch --max-restarts has restarted this job (set by it; with TORCHELASTIC_RESTART_COUNT); "
       "round N > 0 rendezvouses under the store prefix restart<N>/"},
      {"TRIDENT_MAX_RESTARTS", "0", "the job's --max-restarts (set by trident launch); > 0 makes train's resume default auto"},
      {"TRIDENT_SHM_RING_BYTES", "0", "bytes of the shared-memory ring to each of the first 4 local peers a rank sends to (0: 4M up to 4 local ranks, 1M beyond); later peers share 2M, 16K rings each at most"},
      {"TRIDENT_SHM_WINDOW_BYTES", "0", "staging bytes per rank of the shm fast path's window (0: by local ranks)"},
      {"TRIDENT_CMA", "1", "0 = the single-copy (cma) path uses the staged shm path instead of cross-memory attach"},
      {"TRIDENT_CACHE_BYTES", "0",
       "bytes of last-level cache a collective's buffers may assume (0: a quarter of the L3); beyond it cma "
       "all_reduce streams its output"},
      {"TRIDENT_SPIN", "auto",
       "how long a waiting call polls before it sleeps: long (about 200 us), short (64 polls) or auto (long "
       "unless the host has more local ranks than cores); short suits ranks that share their core with compute "
       "threads"},
      {"TRIDENT_CHUNK_BYTES", "0", "pipelining chunk of the bandwidth algorithms (0 = chosen by size)"},
      {"TRIDENT_TUNING_FILE", "",
       "measured algorithm choices written by `trident bench comm --tune FILE` (\"\" = cost model)"},
      {"TRIDENT_HOSTNAME", "", "host identity used to group ranks (defaults to the hostname)"},
      {"TRIDENT_HOST_ID", "",
       "host identity used to group ranks; wins over TRIDENT_HOSTNAME (emulated hosts: netns, tests)"},
      {"TRIDENT_BIND", "auto",
       "CPU binding of the local ranks trident launch / bench --nproc / train --nproc start: none|core|auto"},
      {"TRIDENT_TCP_SOCKBUF", "0", "SO_SNDBUF/SO_RCVBUF of every TCP connection (0 = the largest the kernel allows)"},
      {"TRIDENT_TCP_MAX_IO", "0",
       "tests only: at most this many bytes per TCP send/recv call (0 = no cap; forces partial I/O)"},
      {"TRIDENT_SOCKET_ADDR", "", "address other hosts reach this rank at (default: the route to MASTER_ADDR)"},
      {"TRIDENT_MPI_CHECK", "0",
       "backend mpi: 1 = before every collective, check that every rank issues the same one (one 32-byte "
       "all-gather per call; a mismatch raises MismatchError naming the ranks instead of a hang or a timeout)"},
      {"TRIDENT_MPI_SERIALIZE", "0", "backend mpi: 1 = serialize every MPI call through one mutex even with MPI_THREAD_MULTIPLE"},
      {"TRIDENT_ISA", "auto",
       "CPU kernels' instruction set: auto (the highest this CPU supports) | amx | avx512bf16 | avx512 | avx2 | "
       "portable; a level above the CPU's is an error (`trident env` prints the chosen kernels)"},
      {"TRIDENT_BF16_DOT", "auto",
       "bfloat16 GEMMs at ISA level avx512bf16: auto (vdpbf16ps where it measures at least 1.25x the float32 "
       "FMAs' rate on this CPU; `trident env` prints both) | on | off (float32 FMAs on bf16-rounded operands)"},
      {"TRIDENT_CUDA_IPC", "1",
       "1 = all_reduce, reduce_scatter, all_gather and broadcast on GPU buffers of ranks on one host read each "
       "other's memory (CUDA IPC); 0 = they move through host memory"},
      {"TRIDENT_CUDA_IPC_MIN_BYTES", "",
       "smallest collective (bytes of its largest buffer) on the CUDA IPC path; smaller ones move through host "
       "memory (\"\" = the device's crossover, 1M for CUDA)"},
      {"TRIDENT_CUDA_BIAS_EPILOGUE", "0",
       "1 = a CUDA linear layer's bias is added by cuBLASLt as the product is written (its epilogue); 0 = the "
       "bias rows are filled first and the GEMM adds onto them. Off until it has run on a GPU"},
      {"TRIDENT_CUDA_XENT_ONE_PASS", "0",
       "1 = CUDA softmax + cross-entropy reads the logits once for the maximum and the sum of exponentials "
       "(online softmax, 16-byte loads) and once more for the gradient; 0 = separate passes for the maximum "
       "and the sum. Off until it has run on a GPU"},
      {"TRIDENT_CUDA_POOL_RELEASE", "0",
       "1 = the CUDA kernels' stream-ordered scratch pool returns unused memory to the driver at every "
       "synchronisation (CUDA's default); 0 = it keeps it for the next step"},
      {"TRIDENT_FLIGHT_RECORDER_SIZE", "2048",
       "calls (collectives and send/recv) each process group keeps in its flight recorder ring; 0 = off"},
      {"TRIDENT_FLIGHT_RECORDER_DIR", "",
       "folder of flight-recorder dumps (one rank_<R>.json per rank; read with `trident inspect DIR`); \"\" = the "
       "run's out_dir/flight_recorder under trident train, else no automatic dumps"},
      {"TRIDENT_HEALTH", "1", "1 = multi-rank training names slow links and late ranks while it runs (train/health.h); 0 = off"},
      {"TRIDENT_HEALTH_BANDWIDTH", "0.5", "health: a step is bad for a link below this fraction of its baseline bandwidth"},
      {"TRIDENT_HEALTH_LATE", "50ms", "health: a step is bad for a rank that makes the others wait this much longer than in its baseline"},
      {"TRIDENT_HEALTH_WINDOW", "8", "health: steps looked at for a warning"},
      {"TRIDENT_HEALTH_BAD_STEPS", "6", "health: bad steps among the last WINDOW that raise a warning"},
      {"TRIDENT_HEALTH_WARMUP", "3", "health: first measured steps ignored (start-up)"},
      {"TRIDENT_HEALTH_BASELINE", "10", "health: measured steps after the warm-up whose median is each link's and rank's baseline"},
      {"TRIDENT_HEALTH_MIN_BYTES", "64K", "health: a link's step is measured when it received at least this much in large messages"},
      {"TRIDENT_HEALTH_LINKS", "tcp", "health: links checked for bandwidth, tcp (between hosts) | all (also shared memory)"},
      {"TRIDENT_TORCH_INLINE", "0",
       "torch backend (trident_torch): 1 = a collective issued while none is queued runs on the caller's thread "
       "instead of the group's worker thread (no hand-off; no overlap with the caller's compute)"},
      {"TRIDENT_MPI_WORKER", "0", "tests only: 1 = the MPI backend's test binary runs as one rank under mpirun"},
      {"TRIDENT_LAUNCH_TEST_CHILD", "", "tests only: the launcher test binary runs as the named child role"},
      {"TRIDENT_TEST_KEEP", "0", "tests only: 1 = keep the temporary folders of the model-parallel tests"},
      {"TRIDENT_TEST_VERBOSE", "0", "tests only: 1 = the bf16 storage test prints its measured figures"},
      {"TRIDENT_TEST_KILL_AT", "",
       "tests only: RANK:STEP = train's rank RANK SIGKILLs itself at the start of step STEP in the job's first round "
       "(TRIDENT_RESTART_COUNT 0)"},
      {"TRIDENT_SHARED_DIR", "", "tests only: the shared test-data folder (default: the source tree's ../shared)"},
  };
  return *params;
}

namespace {
// The declared entry of `name`; a TRIDENT_* name missing from the table is a programming error.
const ParamInfo& declared(const char* name) {
  for (const auto& p : all_params())
    if (std::string_view(p.name) == name) return p;
  TRIDENT_THROW(InvalidArgument, "environment variable {} is read but not declared in core/env.cc's table", name);
}
// The value set in the environment, else the table's default.
std::string value_or_default(const char* name) {
  const ParamInfo& p = declared(name);
  return get(name).value_or(p.default_value);
}
}  // namespace

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

std::string get_string(const char* name, const std::string& fallback) { return get(name).value_or(fallback); }

int64_t parse_size(const std::string& text, const std::string& what) {
  if (text.empty()) TRIDENT_THROW(InvalidArgument, "{}: empty value; expected a size such as 4096, 64K, 16M, 1G", what);
  size_t pos = 0;
  long double value = 0;
  try {
    value = std::stold(text, &pos);
  } catch (const std::exception&) {
    TRIDENT_THROW(InvalidArgument, "{}: '{}' is not a size; expected a number such as 4096, 64K, 16M, 1G", what, text);
  }
  std::string suffix = text.substr(pos);
  for (auto& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (suffix == "B") suffix.clear();
  if (!suffix.empty() && suffix.back() == 'B') suffix.pop_back();
  if (!suffix.empty() && suffix.back() == 'I') suffix.pop_back();
  long double mult = 1;
  if (suffix.empty()) mult = 1;
  else if (suffix == "K") mult = 1024.0L;
  else if (suffix == "M") mult = 1024.0L * 1024;
  else if (suffix == "G") mult = 1024.0L * 1024 * 1024;
  else if (suffix == "T") mult = 1024.0L * 1024 * 1024 * 1024;
  else TRIDENT_THROW(InvalidArgument, "{}: '{}' has an unknown unit '{}'; use K, M, G or T", what, text, suffix);
  if (value < 0) TRIDENT_THROW(InvalidArgument, "{}: '{}' is negative", what, text);
  return static_cast<int64_t>(value * mult);
}

double parse_seconds(const std::string& text, const std::string& what) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    TRIDENT_THROW(InvalidArgument, "{}: '{}' is not a duration; expected e.g. 30, 30s, 500ms, 10m", what, text);
  }
  std::string unit = text.substr(pos);
  if (unit.empty() || unit == "s") return value;
  if (unit == "ms") return value / 1000.0;
  if (unit == "us") return value / 1e6;
  if (unit == "m" || unit == "min") return value * 60.0;
  if (unit == "h") return value * 3600.0;
  TRIDENT_THROW(InvalidArgument, "{}: '{}' has an unknown unit '{}'; use ms, s, m or h", what, text, unit);
}

int64_t get_int(const char* name, int64_t fallback, bool sizes) {
  auto v = get(name);
  if (!v) return fallback;
  if (sizes) return parse_size(*v, name);
  size_t pos = 0;
  int64_t out = 0;
  try {
    out = std::stoll(*v, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos != v->size()) TRIDENT_THROW(InvalidArgument, "environment variable {}='{}' is not an integer", name, *v);
  return out;
}

double get_double(const char* name, double fallback) {
  auto v = get(name);
  if (!v) return fallback;
  size_t pos = 0;
  double out = 0;
  try {
    out = std::stod(*v, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos != v->size()) TRIDENT_THROW(InvalidArgument, "environment variable {}='{}' is not a number", name, *v);
  return out;
}

bool get_bool(const char* name, bool fallback) {
  auto v = get(name);
  if (!v) return fallback;
  if (*v == "1" || *v == "true" || *v == "yes" || *v == "on") return true;
  if (*v == "0" || *v == "false" || *v == "no" || *v == "off") return false;
  TRIDENT_THROW(InvalidArgument, "environment variable {}='{}' is not a boolean; use 1/0, true/false, on/off", name, *v);
}

std::string param_string(const char* name) { return value_or_default(name); }
int64_t param_size(const char* name) { return parse_size(value_or_default(name), name); }
bool param_bool(const char* name) {
  const std::string v = value_or_default(name);
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v.empty() || v == "0" || v == "false" || v == "no" || v == "off") return false;
  TRIDENT_THROW(InvalidArgument, "environment variable {}='{}' is not a boolean; use 1/0, true/false, on/off", name, v);
}
double param_seconds(const char* name) { return parse_seconds(value_or_default(name), name); }

std::string log_level() {
  std::string v = param_string("TRIDENT_LOG_LEVEL");
  if (v != "debug" && v != "info" && v != "warn" && v != "error") return "info";
  return v;
}
std::string debug() { return param_string("TRIDENT_DEBUG"); }
double timeout_seconds() { return param_seconds("TRIDENT_TIMEOUT"); }
std::string transport() {
  std::string v = param_string("TRIDENT_TRANSPORT");
  if (v != "auto" && v != "shm" && v != "tcp")
    TRIDENT_THROW(InvalidArgument, "TRIDENT_TRANSPORT='{}': use auto, shm or tcp", v);
  return v;
}
std::string algo() { return param_string("TRIDENT_ALGO"); }
std::string store_token() { return param_string("TRIDENT_STORE_TOKEN"); }
bool store_hosted() { return param_bool("TRIDENT_STORE_HOSTED"); }
int restart_count() { return static_cast<int>(param_size("TRIDENT_RESTART_COUNT")); }
int max_restarts() { return static_cast<int>(param_size("TRIDENT_MAX_RESTARTS")); }
int64_t shm_ring_bytes() { return param_size("TRIDENT_SHM_RING_BYTES"); }
int64_t chunk_bytes() { return param_size("TRIDENT_CHUNK_BYTES"); }
bool short_spin(bool oversubscribed) {
  std::string v = param_string("TRIDENT_SPIN");
  if (v == "auto") return oversubscribed;
  if (v == "short") return true;
  if (v == "long") return false;
  TRIDENT_THROW(InvalidArgument, "TRIDENT_SPIN='{}': use auto, short or long", v);
}
int64_t tcp_sockbuf() { return param_size("TRIDENT_TCP_SOCKBUF"); }
int64_t tcp_max_io() { return param_size("TRIDENT_TCP_MAX_IO"); }
int64_t shm_window_bytes() { return param_size("TRIDENT_SHM_WINDOW_BYTES"); }
bool cma() { return param_bool("TRIDENT_CMA"); }
int64_t cache_bytes() { return param_size("TRIDENT_CACHE_BYTES"); }
std::string tuning_file() { return param_string("TRIDENT_TUNING_FILE"); }
std::string hostname_override() { return param_string("TRIDENT_HOSTNAME"); }
std::string host_id() { return param_string("TRIDENT_HOST_ID"); }
std::string bind() { return param_string("TRIDENT_BIND"); }
std::string socket_addr() { return param_string("TRIDENT_SOCKET_ADDR"); }
bool mpi_check() { return param_bool("TRIDENT_MPI_CHECK"); }
bool mpi_serialize() { return param_bool("TRIDENT_MPI_SERIALIZE"); }
std::string isa() { return param_string("TRIDENT_ISA"); }
std::string bf16_dot() { return param_string("TRIDENT_BF16_DOT"); }

}  // namespace trident::env
