// Rendezvous from the environment: who am I (rank, world, local rank), where is the store, and a connected
// Store for the process group to rendezvous through.
//
// rendezvous_from_env() reads, in this order of precedence (the first launcher whose variables are present wins):
//   torchrun / `trident launch`: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   mpirun:  OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE (Open MPI), or PMI_RANK/PMI_SIZE with
//            MPI_LOCALRANKID/MPI_LOCALNRANKS or PMI_LOCAL_RANK/PMI_LOCAL_SIZE (MPICH, Intel MPI)
//   Slurm:   SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE (or SLURM_TASKS_PER_NODE with
//            SLURM_NODEID, or SLURM_NTASKS / SLURM_NNODES); master = first host of SLURM_JOB_NODELIST
//   nothing: a single process (rank 0 of 1).
// MASTER_ADDR / MASTER_PORT win whenever set; the port defaults to 29500 and the address to rank 0's host
// (the first Slurm node, or 127.0.0.1 when every rank is on this host). Invalid or inconsistent values throw
// InvalidArgument naming the variable and the fix. Pure function of the environment: no I/O, thread-safe as
// far as getenv is (do not call it while another thread calls setenv).
//
// connect_store() blocks until the store is reachable or `timeout` passes (StoreError naming host:port). Rank 0
// hosts the TCPStoreServer on MASTER_PORT (every interface; port 0: a free port, which the returned TCPStore's
// port() reports) unless TRIDENT_STORE_HOSTED=1 says the launcher
// hosts it; every rank, rank 0 included, then connects a TCPStore client with TRIDENT_STORE_TOKEN. The
// returned Store owns the server where rank 0 hosts it, so rank 0 must keep it alive until every rank is done
// with the store. A single process with no launcher variables gets an in-process HashStore. In restart
// round N > 0 of a job (TRIDENT_RESTART_COUNT, set by trident launch --max-restarts) the returned Store is a
// PrefixStore "restart<N>/" over the client: keys a failed round left behind are never seen.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "trident/comm/store/store.h"

namespace trident {

constexpr int kDefaultMasterPort = 29500;

struct RendezvousInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = kDefaultMasterPort;
  std::string source = "single";  // "torchrun", "mpirun", "slurm", "single"
};

RendezvousInfo rendezvous_from_env();

std::shared_ptr<Store> connect_store(const RendezvousInfo& info, Seconds timeout);

// Expands a Slurm host list such as "node[03-05,07],gpu1" into node03 node04 node05 node07 gpu1 (zero padding
// kept; several bracket groups in one name expand as a product). `what` names the variable in errors.
std::vector<std::string> expand_slurm_nodelist(const std::string& list, const std::string& what = "SLURM_JOB_NODELIST");

// Expands Slurm's tasks-per-node list such as "2(x3),1" into 2 2 2 1. `what` names the variable in errors.
std::vector<int> expand_slurm_tasks_per_node(const std::string& list, const std::string& what = "SLURM_TASKS_PER_NODE");

}  // namespace trident
