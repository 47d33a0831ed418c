#include <unistd.h>

#include "trident/comm/backends/mpi_pg.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/rendezvous.h"
#include "trident/core/env.h"
#include "trident/core/log.h"

namespace trident {

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
