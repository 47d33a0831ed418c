// The MPI backend (`--backend mpi`, GroupOptions::backend = "mpi"): the ProcessGroup API over the MPI
// library a cluster already runs (OpenMPI, MPICH), for ranks started by `mpirun`.
//
// Ownership: groups are shared (std::shared_ptr); each owns its MPI communicator (a dup of
// MPI_COMM_WORLD for the world group, MPI_Comm_create / MPI_Comm_split results for subgroups) and frees it
// when destroyed. MPI is initialised once per process on first use (MPI_Init_thread asking for
// MPI_THREAD_MULTIPLE; with less, or with TRIDENT_MPI_SERIALIZE=1, every MPI call is serialized through one
// mutex; TRIDENT_DEBUG=comm logs which) and finalized at exit only when trident initialised it.
// Blocking: every collective is posted at once as a non-blocking MPI call (MPI_Iallreduce, MPI_Isend, ...)
// in issue order, which MPI preserves per communicator; the pending requests are polled with MPI_Test
// by the blocking caller or, for async calls, by the group's worker thread. Collectives' Works complete in
// issue order; a send's or receive's as soon as MPI finished it, so sends and receives never wait behind
// each other (MPI progresses every posted request; its non-overtaking rule keeps one peer's messages with
// one tag in order). new_group and split are collective over this group (a barrier with a deadline, then the blocking
// MPI call).
// Thread-safety: as ProcessGroup: any method from any thread.
// Timeouts: each call's deadline (CallOptions::timeout, else the group's) bounds its MPI_Test loop; on
// expiry the call fails with TimeoutError naming the op, its sequence number and the group. MPI cannot
// cancel a collective, so the group is then failed: pending and later calls fail at once with that error,
// and trident skips MPI_Finalize at exit (it could hang on the abandoned request). abort() fails the group
// on this rank only (MPI has no way to wake other ranks short of MPI_Abort, which ends the job).
// Differences from the native backend: collective fingerprints only on request (MPI itself does not
// detect ranks that issue different collectives; they time out instead): TRIDENT_MPI_CHECK=1 all-gathers
// each collective's fingerprint (sequence number, op, dtype, reduction, root, count) before posting it and
// raises MismatchError naming the first rank that differs and both calls, at the price of one small
// blocking all-gather per call. CallOptions::algo other than auto is ignored (MPI chooses), counts above
// INT_MAX elements per call are an InvalidArgument.
#pragma once

#include <memory>

#include "trident/comm/process_group.h"

namespace trident {

// Whether this trident was built with MPI (TRIDENT_HAVE_MPI).
bool mpi_backend_built();

// The world group over MPI_COMM_WORLD: rank and size come from MPI. Initialises MPI if needed.
// Throws Unsupported when trident was built without MPI.
std::shared_ptr<ProcessGroup> new_mpi_world_group(const GroupOptions& options);

// As new_mpi_world_group, for callers that already know (rank, size) from elsewhere (new_process_group):
// throws InvalidArgument when they differ from MPI's.
std::shared_ptr<ProcessGroup> new_mpi_process_group(int rank, int size, const GroupOptions& options);

}  // namespace trident
