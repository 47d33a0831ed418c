// ProcessGroup: a set of ranks that run collectives together (c10d's ProcessGroup / Backend).
//
// Ownership: shared (std::shared_ptr); a rank may hold many groups at once (a 3-D mesh holds 3).
// Thread-safety: every method may be called from any thread. Ordering: collectives on one group run in
// the order in which they are issued (each gets the group's next sequence number) and complete in that
// order. Sends and receives (no sequence number) start in issue order but never wait behind each other or
// behind collectives: a receive whose message has not arrived holds back nothing but itself, so a rank may
// post a receive and then a send on one group while its peer does the same. Messages from one rank to
// another with one tag are received in the order they were sent (MPI's non-overtaking rule); receives with
// different tags match by tag whatever the order. (Backends: native and mpi as stated; nccl runs sends and
// receives in issue order on one stream, see backends/nccl_pg.h.)
// Blocking: each collective has a blocking form and an `_async` form returning a Work; async collectives
// run on the group's worker thread and overlap with the caller's computation. Buffers must stay valid and
// untouched until the Work completes.
// Timeouts: every call has a deadline (CallOptions::timeout, else the group's timeout, else TRIDENT_TIMEOUT,
// default 600 s). On expiry the error names the op, its sequence number, the group and the ranks not heard
// from. A dead peer fails pending and later collectives within seconds (PeerDiedError names it); ranks that
// issue different collectives at the same sequence number all get a MismatchError naming what each issued.
// After any failure the group is aborted: later calls fail at once with the first error. Every call is
// recorded in the group's flight recorder (comm/flight_recorder.h), which is dumped on such a failure.
//
// One entry point per backend: the named collectives validate their arguments here, once, and call
// post(); a backend implements post() and throws Unsupported for what it cannot do (STYLE.md #6, with one
// virtual instead of twelve so that validation, fingerprints and sequence numbers live in one place).
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "trident/comm/types.h"
#include "trident/comm/work.h"

namespace trident {

class Store;
class FlightRing;

// Memory registered with a group's transport (ProcessGroup::alloc_shared): a collective whose buffer lies in
// one may read and write it in place on the peers' side. The holder owns it (shared); data() is valid and
// size() bytes long until the last holder drops it, also after the group that allocated it is gone. Which
// transport backs it (transport/shm_buffer.h on one host) is the backend's business, not the caller's.
class RegisteredBuffer {
 public:
  virtual ~RegisteredBuffer() = default;
  virtual void* data() const = 0;
  virtual size_t size() const = 0;
};

// How this rank reaches its peers (ProcessGroup::transport_info): for logs, benchmarks and tests, so none of
// them needs to know the backend's type or parse its log line.
struct TransportInfo {
  int shm_peers = 0;    // peers reached over shared memory
  int tcp_peers = 0;    // peers reached over TCP
  int hosts = 1;        // hosts the group spans (every rank agrees)
  std::string summary;  // one line, e.g. "4 ranks on 1 host; transport auto: 3 shm peers, 0 tcp peers"
};

// recv's peer for a receive from any rank: it matches the first message with its tag from any rank, and its
// Work's source_rank() names the sender (native backend; others throw Unsupported, see supports_any_source).
inline constexpr int kAnySource = -1;

struct CallOptions {
  std::optional<Seconds> timeout;  // unset: the group's timeout
  Algo algo = Algo::kAuto;         // force an algorithm (tests, benchmarks)
};

struct GroupOptions {
  std::string backend = "native";  // native | mpi | nccl
  std::string transport;           // auto | shm | tcp ("" = TRIDENT_TRANSPORT, default auto)
  std::optional<Seconds> timeout;  // default deadline of every call ("" = TRIDENT_TIMEOUT, default 600 s)
  std::string name = "world";
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  Seconds timeout() const { return timeout_; }
  void set_timeout(Seconds t) { timeout_ = t; }
  virtual std::string backend_name() const = 0;
  // Which memory the backend reads and writes itself: host memory (native, mpi) or device memory (nccl).
  // A buffer in the other kind (device memory as comm/device_memory.h registers it, or host memory) is
  // copied around the call, here, for every backend: callers pass host and device buffers to any group.
  virtual bool reads_host_memory() const { return true; }
  virtual bool reads_device_memory() const { return false; }
  // Global rank (in the world group) of this group's rank r.
  virtual int global_rank(int r) const { return r; }
  // This rank's transports. Backends that leave transports to their library (mpi, nccl) report no shm or
  // tcp peers and their backend name as the summary. Local, non-blocking, thread-safe.
  virtual TransportInfo transport_info() const { return {0, 0, 1, backend_name()}; }
  // This rank's transfer counters per peer and its recent collectives' times (comm/types.h). Backends that
  // leave transports to their library report none. Local, non-blocking, thread-safe.
  virtual GroupTraffic traffic() const { return {}; }
  // Whether recv accepts kAnySource as its peer.
  virtual bool supports_any_source() const { return false; }

  // ---- async forms ----
  std::shared_ptr<Work> broadcast_async(void* buf, size_t count, DType dtype, int root, const CallOptions& o = {});
  std::shared_ptr<Work> reduce_async(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root,
                                     const CallOptions& o = {});
  std::shared_ptr<Work> all_reduce_async(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                         const CallOptions& o = {});
  std::shared_ptr<Work> all_reduce_async(void* buf, size_t count, DType dtype, ReduceOp op, const CallOptions& o = {}) {
    return all_reduce_async(buf, buf, count, dtype, op, o);
  }
  std::shared_ptr<Work> gather_async(const void* send, void* recv, size_t count, DType dtype, int root,
                                     const CallOptions& o = {});
  std::shared_ptr<Work> scatter_async(const void* send, void* recv, size_t count, DType dtype, int root,
                                      const CallOptions& o = {});
  std::shared_ptr<Work> all_gather_async(const void* send, void* recv, size_t count, DType dtype,
                                         const CallOptions& o = {});
  std::shared_ptr<Work> all_gatherv_async(const void* send, void* recv, const std::vector<size_t>& counts,
                                          DType dtype, const CallOptions& o = {});
  std::shared_ptr<Work> reduce_scatter_async(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                             const CallOptions& o = {});
  std::shared_ptr<Work> all_to_all_async(const void* send, void* recv, size_t count, DType dtype,
                                         const CallOptions& o = {});
  std::shared_ptr<Work> send_async(const void* buf, size_t count, DType dtype, int peer, uint32_t tag = 0,
                                   const CallOptions& o = {});
  std::shared_ptr<Work> recv_async(void* buf, size_t count, DType dtype, int peer, uint32_t tag = 0,
                                   const CallOptions& o = {});
  std::shared_ptr<Work> barrier_async(const CallOptions& o = {});

  // ---- blocking forms: the async form, then wait (a backend may run them without a Work: run_blocking) ----
  void broadcast(void* buf, size_t count, DType dtype, int root, const CallOptions& o = {});
  void reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root, const CallOptions& o = {});
  void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, const CallOptions& o = {});
  void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op, const CallOptions& o = {}) {
    all_reduce(buf, buf, count, dtype, op, o);
  }
  void gather(const void* send, void* recv, size_t count, DType dtype, int root, const CallOptions& o = {});
  void scatter(const void* send, void* recv, size_t count, DType dtype, int root, const CallOptions& o = {});
  void all_gather(const void* send, void* recv, size_t count, DType dtype, const CallOptions& o = {});
  void all_gatherv(const void* send, void* recv, const std::vector<size_t>& counts, DType dtype,
                   const CallOptions& o = {});
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, const CallOptions& o = {});
  void all_to_all(const void* send, void* recv, size_t count, DType dtype, const CallOptions& o = {});
  void send(const void* buf, size_t count, DType dtype, int peer, uint32_t tag = 0, const CallOptions& o = {});
  void recv(void* buf, size_t count, DType dtype, int peer, uint32_t tag = 0, const CallOptions& o = {});
  void barrier(const CallOptions& o = {});

  // ---- subgroups ----
  // Every rank of this group must call new_group with the same list (in the same order relative to other
  // subgroup creations); ranks not in `ranks` get nullptr. `ranks` are ranks of this group, each listed once,
  // and not empty: InvalidArgument otherwise (checked here, for every backend, before make_group).
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks, const std::string& name = {});
  // Every rank calls; ranks with the same color form a group, ordered by (key, rank); color < 0 gets nullptr.
  virtual std::shared_ptr<ProcessGroup> split(int color, int key) = 0;

  // Aborts the group: pending and later calls on every rank fail with `reason`.
  virtual void abort(const std::string& reason) = 0;

  // The algorithm the backend would run for this call (for logs, `bench comm` and tests).
  virtual Algo choose_algorithm(const CollArgs& args, Algo forced) const { return forced; }

  // ---- registered memory ----
  // Memory this group's collectives use in place, without a copy (PyTorch's symmetric memory, NCCL's
  // registered buffers): on the native backend with a shared-memory window (every rank on this host), a
  // shared mapping (transport/shm_buffer.h, faulted in) that the peers map and read and write with plain loads
  // and stores; a collective whose buffer lies in one skips the kernel copies (docs/PERFORMANCE.md,
  // "Collectives": the registered-buffer rows). nullptr when the group gains nothing from it (TCP or several hosts, the MPI and
  // NCCL backends): use ordinary memory then. Local to this rank (not a collective; ranks may mix
  // registered and ordinary buffers in one call). The buffer stays valid while the caller holds it, also
  // after the group is gone; it can serve any group of this process. Throws IoError when the memory cannot
  // be had (memfd, /dev/shm or RAM full).
  virtual std::shared_ptr<RegisteredBuffer> alloc_shared(size_t bytes);

  // This group's flight recorder (comm/flight_recorder.h): every call is recorded here, for every backend,
  // before the backend sees it. nullptr when TRIDENT_FLIGHT_RECORDER_SIZE=0.
  const std::shared_ptr<FlightRing>& flight_ring() const { return flight_; }

 protected:
  ProcessGroup(int rank, int size, std::string name, Seconds timeout);
  // A backend reports that it began running call `a` as collective `seq` (0: point-to-point) with `algo`
  // (the recorder already has the call; this adds the start time and what the backend chose).
  void record_started(const CollArgs& a, uint64_t seq, Algo algo);
  // The one entry point a backend implements. `args` is validated. `blocking` says that the caller
  // will wait right away (a backend may then run the call on the caller's thread).
  virtual std::shared_ptr<Work> post(const CollArgs& args, const CallOptions& opts, bool blocking) = 0;
  // new_group after its checks: `ranks` are valid, distinct and not empty.
  virtual std::shared_ptr<ProcessGroup> make_group(const std::vector<int>& ranks, const std::string& name) = 0;
  // A blocking call (`args` validated): returns when it finished, throws its error. Functionally
  // post(args, opts, true)->wait(), which is the default; a backend may override it to run the call on the
  // caller's thread without allocating a Work (the native backend does when nothing else is queued).
  virtual void run_blocking(const CollArgs& args, const CallOptions& opts) { post(args, opts, true)->wait(); }
  // Aborts the device lane's group too (see DeviceLane), so that its pending calls fail with `reason`.
  // A backend's abort() calls it.
  void abort_device_lane(const std::string& reason);

 private:
  struct Staging;
  struct DeviceLane;
  // The device path: a collective on device buffers whose ranks share a host runs in device kernels that
  // read the peers' buffers (comm/device_memory.h). device_path_applies says whether call `a` is one (the
  // same answer on every rank of a well-formed call: op, size, buffer kinds, transports); run_on_device runs
  // it on this thread: false when it did not (some rank cannot share its memory) and it goes to the backend,
  // staged.
  bool device_path_applies(const CollArgs& a) const;
  bool run_on_device(const CollArgs& a, const CallOptions& o);
  // The lane that runs this group's device-path calls after the first one succeeded (null before, and on a
  // lane's own group); on_device_path_ran creates it.
  std::shared_ptr<DeviceLane> device_lane();
  void on_device_path_ran();
  // Rewrites the buffers of `a` that the backend cannot read to copies it can (filled with the caller's
  // data); null when the call needs none (see reads_host_memory / reads_device_memory).
  std::unique_ptr<Staging> stage(CollArgs& a) const;
  static std::shared_ptr<Work> after_staging(std::shared_ptr<Work> inner, std::unique_ptr<Staging> staged);
  std::shared_ptr<Work> submit(CollArgs args, const CallOptions& opts, bool blocking);
  void run_recorded(CollArgs& args, const CallOptions& opts);  // a validated blocking call
  uint64_t record_enqueue(const CollArgs& a);
  void validate(const CollArgs& a) const;
  int rank_;
  int size_;
  std::string name_;
  Seconds timeout_;
  std::shared_ptr<FlightRing> flight_;
  std::once_flag flight_described_;
  std::mutex lane_mu_;
  std::shared_ptr<DeviceLane> lane_;  // guarded by lane_mu_
  bool is_lane_ = false;              // this group is a lane's: it runs device-path calls on its caller's thread
};

// Creates the world group from the environment (torchrun, mpirun or Slurm variables; see
// comm/store/rendezvous.h): connects the store, then builds the backend.
std::shared_ptr<ProcessGroup> init_process_group(const GroupOptions& options = {});
// Creates a group over an existing store (tests run ranks as threads over a HashStore, or as processes
// over a FileStore/TCPStore). Every rank calls it with the same size and options.
// Throws InvalidArgument for a backend not in backend_table(), Unsupported for one not built.
std::shared_ptr<ProcessGroup> new_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                const GroupOptions& options = {});

// The backends GroupOptions::backend names, as data (defined in comm/init.cc): new_process_group looks the
// name up here, so adding a backend is one row.
struct BackendInfo {
  const char* name;
  const char* description;
  bool (*built)();  // compiled into this trident
  std::shared_ptr<ProcessGroup> (*make)(std::shared_ptr<Store> store, int rank, int size, const GroupOptions& o);
};
const std::vector<BackendInfo>& backend_table();

}  // namespace trident
