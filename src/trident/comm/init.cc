#include <unistd.h>

#include "trident/comm/backends/mpi_pg.h"
#include "trident/comm/backends/nccl_pg.h"
#include "trident/comm/native/native_pg.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/rendezvous.h"
#include "trident/core/env.h"
#include "trident/core/error.h"
#include "trident/core/log.h"

namespace trident {

const std::vector<BackendInfo>& backend_table() {
  static const std::vector<BackendInfo> table = {
      {"native", "trident's algorithms over shared memory and TCP", [] { return true; },
       [](std::shared_ptr<Store> store, int rank, int size, const GroupOptions& o) -> std::shared_ptr<ProcessGroup> {
         return std::make_shared<NativeProcessGroup>(std::move(store), rank, size, o, std::vector<int>{});
       }},
      {"mpi", "MPI (rank and size from MPI itself)", mpi_backend_built,
       [](std::shared_ptr<Store>, int rank, int size, const GroupOptions& o) { return new_mpi_process_group(rank, size, o); }},
      {"nccl", "NCCL on device buffers", nccl_backend_built, new_nccl_process_group},
  };
  return table;
}

std::shared_ptr<ProcessGroup> new_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                const GroupOptions& options) {
  const std::string name = options.backend.empty() ? "native" : options.backend;
  std::string names;
  for (const auto& b : backend_table()) {
    if (name == b.name) {
      if (!b.built())
        TRIDENT_THROW(Unsupported, "backend '{}' is not built into this trident; use --backend native", b.name);
      return b.make(std::move(store), rank, size, options);
    }
    names += (names.empty() ? "" : ", ") + std::string(b.name);
  }
  TRIDENT_THROW(InvalidArgument, "unknown backend '{}'; use one of {}", options.backend, names);
}

std::shared_ptr<ProcessGroup> init_process_group(const GroupOptions& options) {
  if (options.backend == "mpi") {
    // Rank and size come from MPI itself (MPI_Init_thread under mpirun); no store is needed.
    std::shared_ptr<ProcessGroup> pg = new_mpi_world_group(options);
    set_log_prefix(fmt::format("[rank {}]", pg->rank()));
    log_debug("comm", "rendezvous from MPI: rank {} of {}", pg->rank(), pg->size());
    return pg;
  }
  RendezvousInfo info = rendezvous_from_env();
  Seconds timeout = options.timeout.value_or(Seconds(env::timeout_seconds()));
  set_log_prefix(fmt::format("[rank {}]", info.rank));
  log_debug("comm", "rendezvous from {}: rank {} of {} (local {} of {}), store {}:{}", info.source, info.rank,
            info.world_size, info.local_rank, info.local_world_size, info.master_addr, info.master_port);
  std::shared_ptr<Store> store = connect_store(info, timeout);
  store->set_timeout(timeout);
  return new_process_group(store, info.rank, info.world_size, options);
}

}  // namespace trident
