#include "trident/comm/store/rendezvous.h"

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <optional>

#include "trident/comm/store/hash_store.h"
#include "trident/comm/store/tcp_store.h"
#include "trident/core/env.h"
#include "trident/core/error.h"
#include "trident/core/log.h"

namespace trident {
namespace {

constexpr size_t kMaxExpandedHosts = 1 << 20;

std::optional<std::string> getenv_str(const char* name) { return env::get(name); }

// Parses a decimal integer that must fill the whole text; `fix` says how to repair a bad value.
int parse_int(const std::string& text, const std::string& what, const std::string& fix) {
  size_t i = 0;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
  bool digits = i < text.size();
  for (size_t j = i; j < text.size(); ++j)
    if (!std::isdigit(static_cast<unsigned char>(text[j]))) digits = false;
  long long v = 0;
  if (digits) {
    errno = 0;
    v = std::strtoll(text.c_str(), nullptr, 10);
    if (errno == ERANGE || v < INT_MIN || v > INT_MAX) digits = false;
  }
  if (!digits) TRIDENT_THROW(InvalidArgument, "environment variable {}='{}' is not an integer; {}", what, text, fix);
  return static_cast<int>(v);
}

std::optional<int> env_int(const char* name, const std::string& fix) {
  auto v = getenv_str(name);
  if (!v) return std::nullopt;
  return parse_int(*v, name, fix);
}

// The first of `names` that is set, with its name.
std::optional<std::pair<const char*, int>> first_int(std::initializer_list<const char*> names, const std::string& fix) {
  for (const char* n : names) {
    auto v = env_int(n, fix);
    if (v) return std::make_pair(n, *v);
  }
  return std::nullopt;
}

struct Field {
  const char* name;
  int value;
};

void validate(const RendezvousInfo& r, Field rank, Field world, Field local_rank, Field local_world) {
  const std::string who = r.source == "torchrun" ? "the launcher (torchrun / trident launch)" : r.source;
  if (world.value < 1)
    TRIDENT_THROW(InvalidArgument, "environment variable {}={} must be at least 1 (the number of processes; set by {})",
                  world.name, world.value, who);
  if (rank.value < 0 || rank.value >= world.value)
    TRIDENT_THROW(InvalidArgument,
                  "environment variable {}={} must be in 0..{} ({}={}); check that {} sets both for the same job",
                  rank.name, rank.value, world.value - 1, world.name, world.value, who);
  if (local_world.value < 1 || local_world.value > world.value)
    TRIDENT_THROW(InvalidArgument, "environment variable {}={} must be in 1..{} ({}={})", local_world.name,
                  local_world.value, world.value, world.name, world.value);
  if (local_rank.value < 0 || local_rank.value >= local_world.value)
    TRIDENT_THROW(InvalidArgument, "environment variable {}={} must be in 0..{} ({}={})", local_rank.name,
                  local_rank.value, local_world.value - 1, local_world.name, local_world.value);
}

int master_port_from_env() {
  auto v = env_int("MASTER_PORT", "set MASTER_PORT to a free TCP port such as 29500");
  if (!v) return kDefaultMasterPort;
  if (*v < 1 || *v > 65535)
    TRIDENT_THROW(InvalidArgument, "environment variable MASTER_PORT={} is out of range; use a free port in 1..65535",
                  *v);
  return *v;
}

std::optional<std::string> slurm_first_host() {
  for (const char* name : {"SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_STEP_NODELIST"}) {
    auto v = getenv_str(name);
    if (!v) continue;
    auto hosts = expand_slurm_nodelist(*v, name);
    if (!hosts.empty()) return hosts.front();
  }
  return std::nullopt;
}

// MASTER_ADDR, else `fallback`, else 127.0.0.1 when every rank is on this host; otherwise the user must say.
std::string master_addr(const RendezvousInfo& r, std::optional<std::string> fallback) {
  if (auto v = getenv_str("MASTER_ADDR")) return *v;
  if (fallback) return *fallback;
  if (r.local_world_size == r.world_size) return "127.0.0.1";
  TRIDENT_THROW(InvalidArgument,
                "{} ranks span several hosts ({} of {} on this one) but MASTER_ADDR is not set; set MASTER_ADDR to "
                "the host of rank 0 (e.g. mpirun -x MASTER_ADDR=<host>)",
                r.source, r.local_world_size, r.world_size);
}

std::vector<std::string> split_top_level(const std::string& s, const std::string& what) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char c : s) {
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) break;
    if (c == ',' && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  if (depth != 0)
    TRIDENT_THROW(InvalidArgument, "{}='{}' has unbalanced brackets; expected a Slurm host list like node[01-04],gpu1",
                  what, s);
  out.push_back(cur);
  return out;
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

std::vector<std::string> expand_host(const std::string& item, const std::string& list, const std::string& what) {
  auto bad = [&](const std::string& why) {
    TRIDENT_THROW(InvalidArgument, "{}='{}': {}; expected a Slurm host list like node[01-04,07],gpu1", what, list, why);
  };
  size_t open = item.find('[');
  if (open == std::string::npos) {
    if (item.find(']') != std::string::npos) bad("unbalanced brackets");
    return {item};
  }
  size_t close = item.find(']', open);
  if (close == std::string::npos) bad("unbalanced brackets");
  std::string prefix = item.substr(0, open);
  std::string body = item.substr(open + 1, close - open - 1);
  std::vector<std::string> rest = expand_host(item.substr(close + 1), list, what);
  std::vector<std::string> middles;
  size_t start = 0;
  while (start <= body.size()) {
    size_t comma = body.find(',', start);
    if (comma == std::string::npos) comma = body.size();
    std::string part = body.substr(start, comma - start);
    start = comma + 1;
    size_t dash = part.find('-');
    std::string lo = dash == std::string::npos ? part : part.substr(0, dash);
    std::string hi = dash == std::string::npos ? part : part.substr(dash + 1);
    if (!all_digits(lo) || !all_digits(hi) || lo.size() > 9 || hi.size() > 9)
      bad(fmt::format("range '{}' is not a number or a range of numbers", part));
    long a = std::stol(lo), b = std::stol(hi);
    if (a > b) bad(fmt::format("range '{}' runs backwards", part));
    if (middles.size() + static_cast<size_t>(b - a + 1) > kMaxExpandedHosts) bad("too many hosts");
    for (long n = a; n <= b; ++n) middles.push_back(fmt::format("{:0{}d}", n, lo.size()));
  }
  if (middles.size() * rest.size() > kMaxExpandedHosts) bad("too many hosts");
  std::vector<std::string> out;
  out.reserve(middles.size() * rest.size());
  for (auto& m : middles)
    for (auto& r : rest) out.push_back(prefix + m + r);
  return out;
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& list, const std::string& what) {
  std::vector<std::string> out;
  for (auto& item : split_top_level(list, what)) {
    if (item.empty())
      TRIDENT_THROW(InvalidArgument, "{}='{}' has an empty host name; expected a Slurm host list like node[01-04],gpu1",
                    what, list);
    for (auto& h : expand_host(item, list, what)) out.push_back(std::move(h));
    if (out.size() > kMaxExpandedHosts)
      TRIDENT_THROW(InvalidArgument, "{}='{}' expands to too many hosts", what, list);
  }
  return out;
}

std::vector<int> expand_slurm_tasks_per_node(const std::string& list, const std::string& what) {
  std::vector<int> out;
  size_t start = 0;
  auto bad = [&] {
    TRIDENT_THROW(InvalidArgument, "{}='{}' is not a Slurm tasks-per-node list like 2(x3),1", what, list);
  };
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    std::string part = list.substr(start, comma - start);
    start = comma + 1;
    std::string count = part, repeat = "1";
    size_t paren = part.find("(x");
    if (paren != std::string::npos) {
      if (part.back() != ')') bad();
      count = part.substr(0, paren);
      repeat = part.substr(paren + 2, part.size() - paren - 3);
    }
    if (!all_digits(count) || !all_digits(repeat) || count.size() > 9 || repeat.size() > 7) bad();
    int c = std::stoi(count), n = std::stoi(repeat);
    if (out.size() + static_cast<size_t>(n) > kMaxExpandedHosts) bad();
    out.insert(out.end(), static_cast<size_t>(n), c);
  }
  return out;
}

RendezvousInfo rendezvous_from_env() {
  RendezvousInfo r;
  auto has = [](const char* n) { return getenv_str(n).has_value(); };

  if (has("RANK") || has("WORLD_SIZE")) {
    r.source = "torchrun";
    const std::string fix = "the launcher (torchrun / trident launch) sets RANK and WORLD_SIZE to integers";
    auto rank = env_int("RANK", fix), world = env_int("WORLD_SIZE", fix);
    if (!rank || !world)
      TRIDENT_THROW(InvalidArgument, "{} is set but {} is not; set both (as torchrun and trident launch do) or neither",
                    rank ? "RANK" : "WORLD_SIZE", rank ? "WORLD_SIZE" : "RANK");
    r.rank = *rank;
    r.world_size = *world;
    // Without the local variables, assume every rank is on this host (as a plain single-host launch).
    r.local_world_size = env_int("LOCAL_WORLD_SIZE", "set LOCAL_WORLD_SIZE to the number of ranks on this host")
                             .value_or(r.world_size);
    r.local_rank = env_int("LOCAL_RANK", "set LOCAL_RANK to this rank's index on its host")
                       .value_or(r.local_world_size == r.world_size ? r.rank : 0);
    validate(r, {"RANK", r.rank}, {"WORLD_SIZE", r.world_size},
             {"LOCAL_RANK", r.local_rank}, {"LOCAL_WORLD_SIZE", r.local_world_size});
    if (!has("LOCAL_RANK") && r.local_world_size != r.world_size)
      TRIDENT_THROW(InvalidArgument, "LOCAL_WORLD_SIZE={} is set but LOCAL_RANK is not; set LOCAL_RANK too",
                    r.local_world_size);
    r.master_addr = master_addr(r, std::nullopt);
  } else if (has("OMPI_COMM_WORLD_RANK") || has("OMPI_COMM_WORLD_SIZE") || has("PMI_RANK") || has("PMI_SIZE")) {
    r.source = "mpirun";
    const std::string fix = "these are set by mpirun; run under mpirun or unset them";
    bool ompi = has("OMPI_COMM_WORLD_RANK") || has("OMPI_COMM_WORLD_SIZE");
    const char* rank_name = ompi ? "OMPI_COMM_WORLD_RANK" : "PMI_RANK";
    const char* world_name = ompi ? "OMPI_COMM_WORLD_SIZE" : "PMI_SIZE";
    auto rank = env_int(rank_name, fix), world = env_int(world_name, fix);
    if (!rank || !world)
      TRIDENT_THROW(InvalidArgument, "{} is set but {} is not; both come from mpirun", rank ? rank_name : world_name,
                    rank ? world_name : rank_name);
    r.rank = *rank;
    r.world_size = *world;
    auto lws = ompi ? first_int({"OMPI_COMM_WORLD_LOCAL_SIZE"}, fix)
                    : first_int({"MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"}, fix);
    auto lr = ompi ? first_int({"OMPI_COMM_WORLD_LOCAL_RANK"}, fix)
                   : first_int({"MPI_LOCALRANKID", "PMI_LOCAL_RANK"}, fix);
    Field lws_f{lws ? lws->first : (ompi ? "OMPI_COMM_WORLD_LOCAL_SIZE" : "MPI_LOCALNRANKS"),
                lws ? lws->second : r.world_size};
    Field lr_f{lr ? lr->first : (ompi ? "OMPI_COMM_WORLD_LOCAL_RANK" : "MPI_LOCALRANKID"),
               lr ? lr->second : (lws_f.value == r.world_size ? r.rank : 0)};
    r.local_world_size = lws_f.value;
    r.local_rank = lr_f.value;
    validate(r, {rank_name, r.rank}, {world_name, r.world_size}, lr_f, lws_f);
    if (!lr && r.local_world_size != r.world_size)
      TRIDENT_THROW(InvalidArgument, "{} is set but the local rank is not; run under a complete mpirun", lws_f.name);
    r.master_addr = master_addr(r, getenv_str("MASTER_ADDR") ? std::nullopt : slurm_first_host());
  } else if (has("SLURM_PROCID")) {
    r.source = "slurm";
    const std::string fix = "these are set by srun; run under srun or unset them";
    r.rank = *env_int("SLURM_PROCID", fix);
    auto world = first_int({"SLURM_NTASKS", "SLURM_NPROCS"}, fix);
    if (!world)
      TRIDENT_THROW(InvalidArgument, "SLURM_PROCID is set but SLURM_NTASKS is not; launch the ranks with srun -n N");
    r.world_size = world->second;
    Field lws_f{"SLURM_NTASKS_PER_NODE", 0};
    if (auto v = getenv_str("SLURM_NTASKS_PER_NODE")) {
      // Usually one integer; heterogeneous jobs may give a list: take this node's entry.
      auto counts = expand_slurm_tasks_per_node(*v, "SLURM_NTASKS_PER_NODE");
      int node = env_int("SLURM_NODEID", fix).value_or(0);
      lws_f.value = counts.size() == 1 ? counts[0]
                                       : (node >= 0 && node < static_cast<int>(counts.size()) ? counts[node] : 0);
    } else if (auto v2 = getenv_str("SLURM_TASKS_PER_NODE")) {
      lws_f.name = "SLURM_TASKS_PER_NODE";
      auto counts = expand_slurm_tasks_per_node(*v2, "SLURM_TASKS_PER_NODE");
      int node = env_int("SLURM_NODEID", fix).value_or(0);
      if (node < 0 || node >= static_cast<int>(counts.size()))
        TRIDENT_THROW(InvalidArgument, "SLURM_NODEID={} has no entry in SLURM_TASKS_PER_NODE='{}'", node, *v2);
      lws_f.value = counts[node];
    } else if (auto nodes = first_int({"SLURM_NNODES", "SLURM_JOB_NUM_NODES"}, fix)) {
      lws_f.name = nodes->first;
      if (nodes->second < 1 || r.world_size % nodes->second != 0)
        TRIDENT_THROW(InvalidArgument,
                      "cannot derive the tasks per node: SLURM_NTASKS={} is not a multiple of {}={}; set "
                      "SLURM_NTASKS_PER_NODE (srun --ntasks-per-node)",
                      r.world_size, nodes->first, nodes->second);
      lws_f.value = r.world_size / nodes->second;
    } else {
      lws_f.value = r.world_size;
    }
    r.local_world_size = lws_f.value;
    r.local_rank = env_int("SLURM_LOCALID", fix).value_or(r.local_world_size == r.world_size ? r.rank : 0);
    validate(r, {"SLURM_PROCID", r.rank}, {world->first, r.world_size}, {"SLURM_LOCALID", r.local_rank}, lws_f);
    r.master_addr = master_addr(r, getenv_str("MASTER_ADDR") ? std::nullopt : slurm_first_host());
  } else {
    r.source = "single";
    r.master_addr = getenv_str("MASTER_ADDR").value_or("127.0.0.1");
  }
  r.master_port = master_port_from_env();
  return r;
}

std::shared_ptr<Store> connect_store(const RendezvousInfo& info, Seconds timeout) {
  bool hosted = env::store_hosted();
  if (info.source == "single" && info.world_size == 1 && !hosted) {
    auto s = std::make_shared<HashStore>();
    s->set_timeout(timeout);
    return s;
  }
  std::string token = env::store_token();
  std::unique_ptr<TCPStoreServer> server;
  if (info.rank == 0 && !hosted) {
    server = std::make_unique<TCPStoreServer>("", info.master_port, token);
    log_debug("store", "rank 0 hosts the store on port {}", server->port());
  }
  // The server's real port: the same as master_port, or the one the kernel gave when master_port is 0.
  const int port = server ? server->port() : info.master_port;
  auto client = std::make_shared<TCPStore>(info.master_addr, port, token, timeout);
  if (server) client->adopt_server(std::move(server));
  // A job restarted by trident launch --max-restarts rendezvouses again on the same store: each round has
  // its own namespace, so no key a failed round left behind can be read by the next one.
  if (const int round = env::restart_count(); round > 0) {
    return std::make_shared<PrefixStore>(fmt::format("restart{}", round), std::move(client));
  }
  return client;
}

}  // namespace trident
