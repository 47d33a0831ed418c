// Environment parameters. Each TRIDENT_* variable is declared once, here, with its default and meaning,
// and parsed once (STYLE.md #13). A bad value is an InvalidArgument that names the variable and what is
// allowed. `trident env` prints the table.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace trident::env {

struct ParamInfo {
  const char* name;
  const char* default_value;
  const char* help;
};
// Every declared TRIDENT_* parameter, for documentation and `trident env`.
const std::vector<ParamInfo>& all_params();

// Raw access (nullopt when unset or empty).
std::optional<std::string> get(const char* name);
std::string get_string(const char* name, const std::string& fallback);
// Parses an integer; accepts K/M/G suffixes (powers of 1024) when `sizes` is true.
int64_t get_int(const char* name, int64_t fallback, bool sizes = false);
double get_double(const char* name, double fallback);
bool get_bool(const char* name, bool fallback);

// Parses "64", "4K", "16M", "1G" (powers of 1024) or plain bytes; throws InvalidArgument naming `what`.
int64_t parse_size(const std::string& text, const std::string& what);
// Parses a duration: "30", "30s", "500ms", "10m"; returns seconds.
double parse_seconds(const std::string& text, const std::string& what);

// A declared parameter's value: the environment's, else the table's default (one place for each default).
// Reading a TRIDENT_* name the table does not declare throws InternalError. Tests and tools with a variable
// of their own declare it in the table too and read it through these.
std::string param_string(const char* name);
int64_t param_size(const char* name);     // parse_size of the value
bool param_bool(const char* name);        // 1/0, true/false, yes/no, on/off
double param_seconds(const char* name);   // parse_seconds of the value

// Declared parameters.
std::string log_level();          // TRIDENT_LOG_LEVEL
std::string debug();              // TRIDENT_DEBUG
double timeout_seconds();         // TRIDENT_TIMEOUT
std::string transport();          // TRIDENT_TRANSPORT: auto|shm|tcp
std::string algo();               // TRIDENT_ALGO: forces an algorithm for every collective ("" = auto)
std::string store_token();        // TRIDENT_STORE_TOKEN
bool store_hosted();              // TRIDENT_STORE_HOSTED: the launcher hosts the store (rank 0 does not)
int restart_count();              // TRIDENT_RESTART_COUNT: the launcher's restart round of this job (0: first)
int max_restarts();               // TRIDENT_MAX_RESTARTS: the job's --max-restarts (0: none)
int64_t shm_ring_bytes();         // TRIDENT_SHM_RING_BYTES (0: by local ranks)
int64_t chunk_bytes();            // TRIDENT_CHUNK_BYTES
// TRIDENT_SPIN: whether waits poll briefly (64 polls) instead of about 200 us before sleeping; `oversubscribed`
// (more local ranks than cores) is what auto follows.
bool short_spin(bool oversubscribed);
int64_t tcp_sockbuf();            // TRIDENT_TCP_SOCKBUF: SO_SNDBUF/SO_RCVBUF of TCP connections (0: kernel maximum)
int64_t tcp_max_io();             // TRIDENT_TCP_MAX_IO: cap on bytes per TCP send/recv call (0: none; tests)
int64_t shm_window_bytes();       // TRIDENT_SHM_WINDOW_BYTES (0: by local ranks; shm fast path staging)
bool cma();                       // TRIDENT_CMA: 0 = no cross-memory attach (the cma algorithm stages instead)
int64_t cache_bytes();            // TRIDENT_CACHE_BYTES (0: a quarter of the L3): footprint a collective keeps cached
std::string tuning_file();        // TRIDENT_TUNING_FILE: tuning file of `bench comm --tune` ("" = cost model)
std::string hostname_override();  // TRIDENT_HOSTNAME (testability: emulate hosts)
std::string host_id();            // TRIDENT_HOST_ID: host identity (wins over TRIDENT_HOSTNAME and the hostname)
std::string bind();               // TRIDENT_BIND: CPU binding of launched local ranks, none|core|auto (launch/ parses)
std::string socket_addr();        // TRIDENT_SOCKET_ADDR: address other hosts reach this rank at ("" = route to master)
bool mpi_check();                 // TRIDENT_MPI_CHECK: backend mpi fingerprints every collective
bool mpi_serialize();             // TRIDENT_MPI_SERIALIZE: backend mpi serializes every MPI call
std::string isa();                // TRIDENT_ISA: auto|amx|avx512bf16|avx512|avx2|portable
std::string bf16_dot();           // TRIDENT_BF16_DOT: auto|on|off

}  // namespace trident::env
