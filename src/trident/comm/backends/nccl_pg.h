// The NCCL backend (`--backend nccl`, GroupOptions::backend = "nccl"): the ProcessGroup API over NCCL, for
// ranks that each drive one GPU. Buffers are DEVICE memory (cudaMalloc or managed); host pointers are an
// InvalidArgument naming the buffer.
//
// Ownership: groups are shared (std::shared_ptr). Each owns one NCCL communicator (created in non-blocking
// mode), one CUDA stream (on the group's device) on which every call is enqueued in issue
// order, and a watcher thread that completes Works. Subgroups (new_group, split) come from ncclCommSplit and
// own their own communicator and stream. The device is rank % (number of visible devices); set
// CUDA_VISIBLE_DEVICES per rank to pin another.
// Rendezvous: rank 0 creates the ncclUniqueId and publishes it in the Store under
// "nccl/<group name>/<generation>/id"; the others read it with the store's deadline.
// Blocking: posting enqueues on the group's stream and returns; a Work completes when a CUDA event recorded
// after the call has completed on the device (the watcher polls it), so Work::wait() blocks the host until
// the data are in place. The blocking forms wait at once. The group's stream is a blocking stream, so calls
// are ordered with work on the legacy default stream (stream 0) in both directions; work on the caller's
// own non-blocking streams must be synchronized by the caller before posting (cudaStreamSynchronize, or
// an event), and results read after wait().
// Thread-safety: as ProcessGroup: any method from any thread; enqueues are serialized by a mutex.
// Timeouts: each call's deadline (CallOptions::timeout, else the group's) is checked by the watcher; on
// expiry the communicator is aborted with ncclCommAbort and that call and every later one fail with
// TimeoutError naming the op, its sequence number and the group. An asynchronous NCCL error
// (ncclCommGetAsyncError, e.g. a peer failed) fails the group with NetworkError naming NCCL's result string
// and last error. abort() aborts the communicator on this rank.
// Differences from the native backend: no collective fingerprints (NCCL does not detect ranks that issue
// different collectives; they hang and then time out); send/recv tags are ignored (NCCL matches sends and
// receives between two ranks in issue order); sends and receives run in issue order on the group's one
// stream, so a receive waits for its message before a later send starts (two ranks that each receive
// first and then send deadlock, unlike the native and MPI backends; NCCL lifts this only inside
// ncclGroupStart/End, which this API does not expose: order them, or use a group per direction); CallOptions::algo other than auto is ignored (NCCL chooses;
// NCCL_ALGO/NCCL_PROTO steer it); gather, scatter, all_gatherv and all_to_all are grouped send/recv or
// broadcasts (ncclGroupStart/End).
#pragma once

#include <memory>

#include "trident/comm/process_group.h"

namespace trident {

// Whether this trident was built with NCCL (nvcc and libnccl found at configure time).
bool nccl_backend_built();

// The world group over NCCL: every rank of `size` calls it with the same store and options.
// Throws Unsupported when trident was built without NCCL, NetworkError when no GPU is usable, TimeoutError
// when the communicator is not complete (a rank missing) within the group's timeout.
std::shared_ptr<ProcessGroup> new_nccl_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                     const GroupOptions& options);

}  // namespace trident
