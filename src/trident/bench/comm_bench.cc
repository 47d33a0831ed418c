#include "trident/bench/comm_bench.h"

#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <fstream>
#include <ostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "trident/bench/verifiable.h"
#include "trident/comm/algorithms/algorithm.h"
#include "trident/comm/collective.h"
#include "trident/comm/device_memory.h"
#include "trident/comm/process_group.h"
#include "trident/comm/reduce.h"
#include "trident/core/env.h"
#include "trident/core/error.h"

namespace trident::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Per-call timestamps without a clock_gettime per call. On x86 the time-stamp counter (invariant on every
// CPU trident targets), converted with the rate measured against steady_clock over the same loop: one
// rdtsc (10-40 ns, VMs included) between calls instead of two CLOCK_MONOTONIC reads (40-150 ns on a VM),
// which matters at sub-microsecond latencies. Elsewhere steady_clock.
struct Stamp {
#if defined(__x86_64__)
  static uint64_t now() { return __builtin_ia32_rdtsc(); }
#else
  static uint64_t now() { return static_cast<uint64_t>(Clock::now().time_since_epoch().count()); }
#endif
};

std::string join_names(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : text + ",") {
    if (ch == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else if (ch != ' ') {
      cur += ch;
    }
  }
  return out;
}

// Page-aligned memory, faulted in once (first-touch costs ~10 us per page on this VM: never in the loop):
// private anonymous memory, or the group's registered memory (--buffers shared).
class Buffer {
 public:
  Buffer(size_t bytes, ProcessGroup* shared_from) : bytes_(std::max<size_t>(bytes, 4096)) {
    bytes_ = (bytes_ + 4095) / 4096 * 4096;
    if (shared_from) {
      shared_ = shared_from->alloc_shared(bytes_);
      if (!shared_)
        TRIDENT_THROW(InvalidArgument,
                      "--buffers shared: group '{}' ({} backend) has no registered memory: it needs the native backend "
                      "with every rank on this host over shared memory (not --transport tcp); use --buffers ordinary",
                      shared_from->name(), shared_from->backend_name());
      data_ = static_cast<char*>(shared_->data());
      return;
    }
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED)
      TRIDENT_THROW(InvalidArgument, "bench comm: cannot allocate {} bytes for buffers ({}); lower -e/--maxbytes",
                    bytes_, detail::errno_string(errno));
    data_ = static_cast<char*>(p);
    std::memset(data_, 0, bytes_);  // fault in every page even where MAP_POPULATE is ignored
  }
  ~Buffer() {
    if (!shared_) ::munmap(data_, bytes_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  char* data() { return data_; }

 private:
  size_t bytes_;
  char* data_ = nullptr;
  std::shared_ptr<RegisteredBuffer> shared_;
};

// A mirror of a host Buffer in device memory (--device): the timed calls use it; inputs are copied in after
// the host buffer is filled and outputs copied out before it is checked.
class DeviceBuffer {
 public:
  DeviceBuffer(const DeviceMemory* dm, size_t bytes) : dm_(dm) {
    if (dm_) p_ = static_cast<char*>(dm_->alloc(std::max<size_t>(bytes, 4096)));
  }
  ~DeviceBuffer() {
    if (dm_ && p_) dm_->free(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  char* data() { return p_; }

 private:
  const DeviceMemory* dm_;
  char* p_ = nullptr;
};

struct Case;

// One row per benchmarked collective (nccl-tests' struct testColl): where its buffers are, how its inputs are filled and its outputs checked, and the call. The harness below
// (run_comm_bench) knows no collective by name; a new one is a new row.
struct BenchColl {
  OpKind op;
  bool out_of_place;  // has an out-of-place form (the API broadcasts in place only)
  const void* (*send)(const Case&);  // nullptr: the send buffer (in place: the receive buffer)
  void* (*recv)(const Case&);        // nullptr: the receive buffer
  void (*prepare)(const Case&, int iter);
  uint64_t (*verify)(const Case&, int iter);
  void (*call)(const Case&, ProcessGroup&, const CallOptions&);
};

// One collective at one count in one placement: where its buffers are, how to prepare and check them.
struct Case {
  const BenchColl* coll;
  bool inplace;
  size_t c;  // count per rank
  int n, r, root;
  DType dt;
  ReduceOp redop;
  size_t es;
  char* sendbuf;
  char* recvbuf;

  char* at(char* base, size_t elems) const { return base + elems * es; }
  const void* send() const { return coll->send ? coll->send(*this) : (inplace ? recvbuf : sendbuf); }
  void* recv() const { return coll->recv ? coll->recv(*this) : recvbuf; }
  size_t nc() const { return c * n; }
  size_t cc() const { return std::max<size_t>(c, 1); }
  void fill(void* p, size_t count, int rank, size_t k0, int iter) const {
    fill_input(p, count, dt, rank, k0, iter, redop, collective_info(coll->op).reduces);
  }
  // Inputs for iteration `iter`; outputs poisoned (a poisoned output region that aliases an input is
  // poisoned first, then the input written over it).
  void prepare(int iter) const { coll->prepare(*this, iter); }
  // Wrong elements of this rank's output after iteration `iter`.
  uint64_t verify(int iter) const { return coll->verify(*this, iter); }
  void call(ProcessGroup& pg, const CallOptions& co) const { coll->call(*this, pg, co); }
  // Shared by the reducing rows whose input is count elements (reduce, all_reduce).
  void prepare_one_block(int iter) const {
    if (inplace) {
      fill(recvbuf, c, r, 0, iter);
    } else {
      fill(sendbuf, c, r, 0, iter);
      poison(recvbuf, c, dt);
    }
  }
  uint64_t wrong_gathered(const void* out, int iter, size_t first) const {
    const size_t b = cc();
    return count_wrong_moved(out, nc(), dt, iter, redop, collective_info(coll->op).reduces, [&](size_t i) { return static_cast<int>(i / b); },
                             [&](size_t i) { return first + i % b; });
  }
};

const std::vector<BenchColl>& bench_colls() {
  static const std::vector<BenchColl> rows = {
      {OpKind::kBroadcast, false, [](const Case& k) -> const void* { return k.recvbuf; },
       nullptr,
       [](const Case& k, int iter) {
         if (k.r == k.root) k.fill(k.recvbuf, k.c, k.r, 0, iter);
         else poison(k.recvbuf, k.c, k.dt);
       },
       [](const Case& k, int iter) -> uint64_t {
         return count_wrong_moved(k.recvbuf, k.c, k.dt, iter, k.redop, false, [&](size_t) { return k.root; },
                                  [](size_t i) { return i; });
       },
       [](const Case& k, ProcessGroup& pg, const CallOptions& co) { pg.broadcast(k.recvbuf, k.c, k.dt, k.root, co); }},
      {OpKind::kReduce, true, nullptr, nullptr,
       [](const Case& k, int iter) { k.prepare_one_block(iter); },
       [](const Case& k, int iter) -> uint64_t {
         return k.r == k.root ? count_wrong_reduced(k.recv(), k.c, k.dt, k.n, 0, iter, k.redop) : 0;
       },
       [](const Case& k, ProcessGroup& pg, const CallOptions& co) {
         pg.reduce(k.send(), k.recv(), k.c, k.dt, k.redop, k.root, co);
       }},
      {OpKind::kAllReduce, true, nullptr, nullptr,
       [](const Case& k, int iter) { k.prepare_one_block(iter); },
       [](const Case& k, int iter) -> uint64_t { return count_wrong_reduced(k.recv(), k.c, k.dt, k.n, 0, iter, k.redop); },
       [](const Case& k, ProcessGroup& pg, const CallOptions& co) {
         pg.all_reduce(k.send(), k.recv(), k.c, k.dt, k.redop, co);
       }},
      {OpKind::kGather, true,
       [](const Case& k) -> const void* { return k.inplace ? k.at(k.recvbuf, k.r * k.c) : k.sendbuf; }, nullptr,
       [](const Case& k, int iter) {
         poison(k.recvbuf, k.nc(), k.dt);
         k.fill(const_cast<void*>(k.send()), k.c, k.r, 0, iter);
       },
       [](const Case& k, int iter) -> uint64_t { return k.r == k.root ? k.wrong_gathered(k.recvbuf, iter, 0) : 0; },
       [](const Case& k, ProcessGroup& pg, const CallOptions& co) { pg.gather(k.send(), k.recv(), k.c, k.dt, k.root, co); }},
      {OpKind::kScatter, true, [](const Case& k) -> const void* { return k.sendbuf; },
       [](const Case& k) -> void* { return k.inplace ? k.at(k.sendbuf, k.r * k.c) : k.recvbuf; },
       [](const Case& k, int iter) {
         if (k.r == k.root) {
           k.fill(k.sendbuf, k.nc(), k.root, 0, iter);
           if (!k.inplace) poison(k.recvbuf, k.c, k.dt);
         } else {
           poison(k.recv(), k.c, k.dt);
         }
       },
       [](const Case& k, int iter) -> uint64_t {
         return count_wrong_moved(k.recv(), k.c, k.dt, iter, k.redop, false, [&](size_t) { return k.root; },
                                  [&](size_t i) { return k.r * k.c + i; });
       },
       [](const Case& k, ProcessGroup& pg, const CallOptions& co) { pg.scatter(k.send(), k.recv(), k.c, k.dt, k.root, co); }},
      {OpKind::kAllGather, true,
       [](const Case& k) -> const void* { return k.inplace ? k.at(k.recvbuf, k.r * k.c) : k.sendbuf; }, nullptr,
       [](const Case& k, int iter) {
         poison(k.recvbuf, k.nc(), k.dt);
         k.fill(const_cast<void*>(k.send()), k.c, k.r, 0, iter);
       },
       [](const Case& k, int iter) -> uint64_t { return k.wrong_gathered(k.recvbuf, iter, 0); },
       [](const Case& k, ProcessGroup& pg, const CallOptions& co) { pg.all_gather(k.send(), k.recv(), k.c, k.dt, co); }},
      {OpKind::kReduceScatter, true, [](const Case& k) -> const void* { return k.sendbuf; },
       [](const Case& k) -> void* { return k.inplace ? k.at(k.sendbuf, k.r * k.c) : k.recvbuf; },
       [](const Case& k, int iter) {
         k.fill(k.sendbuf, k.nc(), k.r, 0, iter);
         if (!k.inplace) poison(k.recvbuf, k.c, k.dt);
       },
       [](const Case& k, int iter) -> uint64_t {
         return count_wrong_reduced(k.recv(), k.c, k.dt, k.n, k.r * k.c, iter, k.redop);
       },
       [](const Case& k, ProcessGroup& pg, const CallOptions& co) {
         pg.reduce_scatter(k.send(), k.recv(), k.c, k.dt, k.redop, co);
       }},
      {OpKind::kAllToAll, true, nullptr, nullptr,
       [](const Case& k, int iter) {
         if (k.inplace) {
           k.fill(k.recvbuf, k.nc(), k.r, 0, iter);
         } else {
           k.fill(k.sendbuf, k.nc(), k.r, 0, iter);
           poison(k.recvbuf, k.nc(), k.dt);
         }
       },
       [](const Case& k, int iter) -> uint64_t { return k.wrong_gathered(k.recvbuf, iter, k.r * k.c); },
       [](const Case& k, ProcessGroup& pg, const CallOptions& co) { pg.all_to_all(k.send(), k.recv(), k.c, k.dt, co); }},
      {OpKind::kBarrier, true, nullptr, nullptr, [](const Case&, int) {},
       [](const Case&, int) -> uint64_t { return 0; },
       [](const Case&, ProcessGroup& pg, const CallOptions& co) { pg.barrier(co); }},
  };
  return rows;
}

const BenchColl& bench_coll(OpKind op) {
  for (const auto& row : bench_colls())
    if (row.op == op) return row;
  TRIDENT_THROW(InvalidArgument, "bench comm: {} is not a benchmarked collective", op_name(op));
}
// Root, reduction and size conventions are the collective's record's (comm/collective.h).
bool op_reduces(OpKind op) { return collective_info(op).reduces; }
bool op_rooted(OpKind op) { return collective_info(op).rooted; }
// size (nccl-tests) = count_per_rank x multiplier x element size.
size_t size_multiplier(OpKind op, int n) { return size_elems(op, 1, n); }
bool has_out_of_place(OpKind op) { return bench_coll(op).out_of_place; }

CollArgs sample_args(OpKind op, size_t c, const CommBenchOptions& o) {
  CollArgs a;
  a.op = op;
  a.count = op == OpKind::kBarrier ? 0 : c;
  a.dtype = o.dtype;
  a.redop = o.redop;
  a.root = op_rooted(op) ? o.root : 0;
  return a;
}

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  size_t idx = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  idx = std::clamp<size_t>(idx, 1, sorted.size()) - 1;
  return sorted[idx];
}

// "shm", "tcp", "shm+tcp" or "none", agreed over the group (a rank's own peers are all it knows).
std::string effective_transport(ProcessGroup& pg) {
  const TransportInfo t = pg.transport_info();
  int64_t kinds[2] = {t.shm_peers > 0, t.tcp_peers > 0};
  if (pg.size() > 1) pg.all_reduce(kinds, 2, DType::kInt64, ReduceOp::kMax);
  if (kinds[0] && kinds[1]) return "shm+tcp";
  if (kinds[0]) return "shm";
  if (kinds[1]) return "tcp";
  return pg.size() > 1 ? pg.backend_name() : "none";
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// One table section: an op run with one requested algorithm over the sweep.
struct Section {
  OpKind op;
  Algo algo;  // requested (kAuto: the backend chooses per size)
  std::vector<size_t> counts;
};

std::string placement_cells(const BenchRecord* rec, bool checked) {
  if (!rec) return fmt::format("  {:>10} {:>7} {:>7} {:>6} {:>10} {:>10} {:>10}", "N/A", "N/A", "N/A", "N/A", "N/A", "N/A", "N/A");
  std::string wrong = checked && rec->wrong ? fmt::format("{}", *rec->wrong) : std::string("N/A");
  return fmt::format("  {:>10.2f} {:>7.2f} {:>7.2f} {:>6} {:>10.2f} {:>10.2f} {:>10.2f}", rec->time_us, rec->algbw, rec->busbw,
                     wrong, rec->lat_min_us, rec->lat_p50_us, rec->lat_p99_us);
}

}  // namespace

const std::vector<OpKind>& bench_ops() {
  static const std::vector<OpKind> ops = [] {
    std::vector<OpKind> v;
    for (const auto& row : bench_colls()) v.push_back(row.op);
    return v;
  }();
  return ops;
}

std::vector<OpKind> parse_ops(const std::string& text, const std::string& flag) {
  std::vector<std::string> names;
  for (OpKind op : bench_ops()) names.push_back(op_name(op));
  const std::string allowed = join_names(names) + ", or all (a comma-separated list is accepted)";
  std::vector<OpKind> out;
  auto items = split_commas(text);
  if (items.empty()) TRIDENT_THROW(InvalidArgument, "{} is empty; use one of {}", flag, allowed);
  for (const auto& item : items) {
    if (item == "all") {
      for (OpKind op : bench_ops())
        if (std::find(out.begin(), out.end(), op) == out.end()) out.push_back(op);
      continue;
    }
    OpKind op;
    try {
      op = parse_op(item);
    } catch (const InvalidArgument&) {
      TRIDENT_THROW(InvalidArgument, "{} '{}' is not a collective; use one of {}", flag, item, allowed);
    }
    if (std::find(bench_ops().begin(), bench_ops().end(), op) == bench_ops().end())
      TRIDENT_THROW(InvalidArgument, "{} '{}' is not benchmarked by bench comm; use one of {}", flag, item, allowed);
    if (std::find(out.begin(), out.end(), op) == out.end()) out.push_back(op);
  }
  return out;
}

std::vector<Algo> parse_algos(const std::string& text, bool* all, const std::string& flag) {
  *all = false;
  std::vector<std::string> names;
  for (int i = 0; i < kNumAlgos; ++i) names.push_back(algo_name(static_cast<Algo>(i)));
  const std::string allowed = join_names(names) + ", or all (every algorithm of each op, then auto)";
  std::vector<Algo> out;
  auto items = split_commas(text);
  if (items.empty()) TRIDENT_THROW(InvalidArgument, "{} is empty; use one of {}", flag, allowed);
  for (const auto& item : items) {
    if (item == "all") {
      *all = true;
      continue;
    }
    Algo a;
    try {
      a = parse_algo(item);
    } catch (const InvalidArgument&) {
      TRIDENT_THROW(InvalidArgument, "{} '{}' is not an algorithm; use one of {}", flag, item, allowed);
    }
    if (std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
  }
  return out;
}

void validate(const CommBenchOptions& o, int world) {
  if (o.ops.empty()) TRIDENT_THROW(InvalidArgument, "--op: no collective given");
  if (o.min_bytes < 1) TRIDENT_THROW(InvalidArgument, "-b/--minbytes must be at least 1 byte, got {}", o.min_bytes);
  if (o.max_bytes < o.min_bytes)
    TRIDENT_THROW(InvalidArgument, "-e/--maxbytes ({}) is below -b/--minbytes ({}); give -e >= -b", o.max_bytes,
                  o.min_bytes);
  if (o.step_factor < 2)
    TRIDENT_THROW(InvalidArgument, "-f/--stepfactor must be an integer >= 2 (sizes grow by this factor), got {}",
                  o.step_factor);
  if (o.iters < 1) TRIDENT_THROW(InvalidArgument, "--iters must be at least 1, got {}", o.iters);
  if (o.warmup < 0) TRIDENT_THROW(InvalidArgument, "--warmup must be at least 0, got {}", o.warmup);
  if (o.root < 0 || o.root >= world)
    TRIDENT_THROW(InvalidArgument, "--root {} is outside [0, {}) for a world of {} ranks", o.root, world, world);
  if (!o.inplace && !o.outofplace)
    TRIDENT_THROW(InvalidArgument, "nothing to run: enable --inplace, --outofplace or both (the default)");
  if (o.buffers != "ordinary" && o.buffers != "shared")
    TRIDENT_THROW(InvalidArgument, "--buffers '{}' is not one of ordinary, shared", o.buffers);
  if (o.device != "cpu" && o.device != "cuda")
    TRIDENT_THROW(InvalidArgument, "--device '{}' is not one of cpu, cuda", o.device);
  if (o.device != "cpu") {
    const DeviceMemory* dm = device_memory();
    if (dm == nullptr || dm->alloc == nullptr || o.device != dm->name)
      TRIDENT_THROW(Unsupported, "--device {}: this build of trident has no {} support (it was configured without "
                    "nvcc); use --device cpu", o.device, o.device);
    if (o.buffers == "shared")
      TRIDENT_THROW(InvalidArgument, "--buffers shared is host memory; with --device {} use --buffers ordinary",
                    o.device);
  }
  if (o.transport != "auto" && o.transport != "shm" && o.transport != "tcp")
    TRIDENT_THROW(InvalidArgument, "--transport '{}' is not one of auto, shm, tcp", o.transport);
  if (o.timeout_s && !(*o.timeout_s > 0))
    TRIDENT_THROW(InvalidArgument, "--timeout must be positive, got {}", *o.timeout_s);
  if (o.dtype == DType::kUInt8) {
    for (OpKind op : o.ops)
      if (op_reduces(op))
        TRIDENT_THROW(InvalidArgument,
                      "--dtype uint8 supports data movement only, but --op includes {} (a reduction); use another "
                      "--dtype or drop reduce, all_reduce and reduce_scatter",
                      op_name(op));
  }
  if (o.algos.empty() && !o.algo_all) TRIDENT_THROW(InvalidArgument, "--algo: no algorithm given");
  if (!o.tune_path.empty() && world < 2)
    TRIDENT_THROW(InvalidArgument, "--tune measures collectives between ranks, but the world has {} rank; run it with "
                  "--nproc 2 or more (or under trident launch)", world);
}

TuningTable tuning_from_records(const std::vector<BenchRecord>& records, const std::string& transport, int world) {
  TuningTable t;
  t.transport = transport;
  t.world_size = world;
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  t.host = host;
  t.date = utc_now();
  for (const BenchRecord& r : records) {
    if (!r.algo_forced) continue;
    t.dtype = r.has_dtype ? dtype_name(r.dtype) : t.dtype;
    TuningEntry* e = nullptr;
    for (auto& x : t.entries)
      if (x.op == r.op && x.algo == r.algo) e = &x;
    if (!e) {
      t.entries.push_back({r.op, r.algo, {}});
      e = &t.entries.back();
    }
    const double bytes = static_cast<double>(r.size);
    // Records of one section come in ascending size, out-of-place before in-place: in-place replaces.
    const double s = std::max(r.lat_p50_us, 1e-3) * 1e-6;
    if (!e->points.empty() && e->points.back().bytes == bytes) {
      if (r.inplace) e->points.back().seconds = s;
    } else if (e->points.empty() || e->points.back().bytes < bytes) {
      e->points.push_back({bytes, s});
    }
  }
  return t;
}

void apply_tune_defaults(CommBenchOptions& o) {
  o.ops.clear();
  for (OpKind op : bench_ops())
    if (algorithms_for(op).size() > 1) o.ops.push_back(op);
  o.algos.clear();
  o.algo_all = true;
  o.min_bytes = 8;
  o.max_bytes = 8ll << 20;
  o.step_factor = 16;
  o.iters = 10;
  o.warmup = 3;
  o.inplace = true;
  o.outofplace = false;
}

nlohmann::ordered_json record_json(const BenchRecord& r) {
  nlohmann::ordered_json j;
  j["op"] = op_name(r.op);
  j["algo"] = algo_name(r.algo);
  j["algo_forced"] = r.algo_forced;
  j["inplace"] = r.inplace;
  j["size"] = r.size;
  j["count"] = r.count;
  j["count_per_rank"] = r.count_per_rank;
  j["dtype"] = r.has_dtype ? dtype_name(r.dtype) : "none";
  j["redop"] = r.has_redop ? reduce_op_name(r.redop) : "none";
  j["root"] = r.root;
  j["time_us"] = r.time_us;
  j["algbw"] = r.algbw;
  j["busbw"] = r.busbw;
  j["wrong"] = r.wrong ? nlohmann::ordered_json(*r.wrong) : nlohmann::ordered_json(nullptr);
  j["lat_min_us"] = r.lat_min_us;
  j["lat_p50_us"] = r.lat_p50_us;
  j["lat_p99_us"] = r.lat_p99_us;
  j["world_size"] = r.world_size;
  j["transport"] = r.transport;
  j["transport_requested"] = r.transport_requested;
  j["buffers"] = r.buffers;
  return j;
}

void write_json(const std::string& path, const std::vector<BenchRecord>& records) {
  std::ofstream f(path);
  if (!f) TRIDENT_THROW(IoError, "--json: cannot open '{}' for writing", path);
  f << "[\n";
  for (size_t i = 0; i < records.size(); ++i)
    f << record_json(records[i]).dump() << (i + 1 < records.size() ? ",\n" : "\n");
  f << "]\n";
  if (!f) TRIDENT_THROW(IoError, "--json: failed writing '{}'", path);
}

CommBenchResult run_comm_bench(ProcessGroup& pg, const CommBenchOptions& o, std::ostream& out) {
  const int n = pg.size(), me = pg.rank();
  validate(o, n);
  const bool lead = me == 0;
  const size_t es = dtype_size(o.dtype);

  // The sweep, per op: count per rank from each size (at least one element), duplicates dropped.
  std::vector<size_t> sizes;
  for (int64_t s = o.min_bytes; s <= o.max_bytes; s *= o.step_factor) {
    sizes.push_back(static_cast<size_t>(s));
    if (s > o.max_bytes / o.step_factor) break;
  }
  std::vector<std::string> notes;
  std::vector<Section> sections;
  size_t max_bytes = 0;
  for (OpKind op : o.ops) {
    std::vector<size_t> counts;
    const size_t mult = size_multiplier(op, n);
    if (op == OpKind::kBarrier) {
      counts.push_back(0);
    } else {
      for (size_t s : sizes) {
        size_t c = std::max<size_t>(1, s / (es * mult));
        if (counts.empty() || counts.back() != c) counts.push_back(c);
      }
      max_bytes = std::max(max_bytes, counts.back() * mult * es);
    }
    if (op == OpKind::kBroadcast && !o.inplace) {
      notes.push_back("broadcast: only an in-place form exists (the API broadcasts in place); skipped under --outofplace");
      continue;
    }
    std::vector<Algo> algos;
    if (o.algo_all) {
      for (const AlgorithmInfo* info : algorithms_for(op)) algos.push_back(info->algo);
      algos.push_back(Algo::kAuto);
    }
    for (Algo a : o.algos)
      if (std::find(algos.begin(), algos.end(), a) == algos.end()) algos.push_back(a);
    for (Algo a : algos) {
      if (a != Algo::kAuto) {
        try {
          pg.choose_algorithm(sample_args(op, counts.front(), o), a);
        } catch (const InvalidArgument& e) {
          notes.push_back(fmt::format("{} algo {}: skipped: {}", op_name(op), algo_name(a), e.what()));
          continue;
        }
      }
      sections.push_back({op, a, counts});
    }
  }
  if (sections.empty())
    TRIDENT_THROW(InvalidArgument, "bench comm: nothing to run: {}", notes.empty() ? std::string("no op") : notes.front());

  // One rank has no peer to share with: its buffers are ordinary either way.
  ProcessGroup* shared_from = o.buffers == "shared" && n > 1 ? &pg : nullptr;
  Buffer sendbuf(max_bytes, shared_from), recvbuf(max_bytes, shared_from);
  const DeviceMemory* dm = o.device == "cpu" ? nullptr : device_memory();  // validate() checked it
  DeviceBuffer dsend(dm, max_bytes), drecv(dm, max_bytes);
  const std::string transport = effective_transport(pg);

  // Who is where: "host pid" of every rank (fixed 64-byte records, gathered once).
  constexpr size_t kRec = 64;
  std::vector<char> mine(kRec, 0), all(kRec * n, 0);
  char host[kRec / 2] = {0};
  ::gethostname(host, sizeof host - 1);
  std::snprintf(mine.data(), kRec, "%s %d", host, static_cast<int>(::getpid()));
  pg.all_gather(mine.data(), all.data(), kRec, DType::kUInt8);

  if (lead) {
    std::string ops;
    for (OpKind op : o.ops) ops += (ops.empty() ? "" : ",") + std::string(op_name(op));
    const std::string summary = pg.transport_info().summary;
    out << "# trident bench comm (nccl-tests conventions: size in bytes, 1 GB = 1e9 B)\n";
    out << fmt::format("# op: {}  minBytes {}  maxBytes {}  step: {}(factor)  warmup iters: {}  iters: {}  check: {}  "
                       "dtype: {}  redop: {}  root: {}\n",
                       ops, o.min_bytes, o.max_bytes, o.step_factor, o.warmup, o.iters, o.check ? 1 : 0,
                       dtype_name(o.dtype), reduce_op_name(o.redop), o.root);
    out << fmt::format("# world size {}; backend {}; transport requested {}, in use {}{}; buffers {}\n", n,
                       pg.backend_name(), o.transport, transport, summary.empty() ? "" : " (" + summary + ")",
                       o.buffers == "shared" ? "shared (the group's registered memory, zero copy)" : "ordinary");
    if (dm)
      out << fmt::format("# buffers in {} device memory ({} backend: {}); inputs written and outputs checked through "
                         "host copies outside the timed calls\n",
                         o.device, pg.backend_name(),
                         pg.reads_device_memory() ? "the backend reads device memory itself"
                                                  : "each call staged through host memory");
    out << fmt::format("# group timeout {:.0f} s; date {}\n", pg.timeout().count(), utc_now());
    for (int r = 0; r < n; ++r) {
      std::string rec(all.data() + r * kRec, strnlen(all.data() + r * kRec, kRec));
      auto sp = rec.rfind(' ');
      out << fmt::format("#  Rank {:2d} Pid {:>7} on {}\n", r, sp == std::string::npos ? "?" : rec.substr(sp + 1),
                         rec.substr(0, sp));
    }
    out << "# time: wall time of each blocking call on each rank (calls back to back, one timestamp between "
           "consecutive calls), a barrier before the timed loop"
        << (o.check ? " (and, with --check, before each iteration after refilling inputs)" : "")
        << "; time = max over ranks of the per-rank mean; lat min/p50/p99 = max over ranks of each rank's value\n";
    for (const auto& note : notes) out << "# note: " << note << "\n";
    out << "#\n" << std::flush;
  }

  CommBenchResult result;
  const std::string hdr_place = fmt::format("  {:>10} {:>7} {:>7} {:>6} {:>10} {:>10} {:>10}", "time", "algbw", "busbw",
                                            "#wrong", "lat_min", "lat_p50", "lat_p99");
  const std::string hdr_units = fmt::format("  {:>10} {:>7} {:>7} {:>6} {:>10} {:>10} {:>10}", "(us)", "(GB/s)", "(GB/s)", "",
                                            "(us)", "(us)", "(us)");
  for (const Section& sec : sections) {
    if (lead) {
      out << fmt::format("# {}  algo {}\n", op_name(sec.op),
                         sec.algo == Algo::kAuto ? std::string("auto (the backend's choice per size)")
                                                 : std::string(algo_name(sec.algo)));
      out << fmt::format("#{:>11} {:>12} {:>8} {:>6} {:>5} {:>18}  {:<67}  {:<67}\n", "", "", "", "", "", "",
                         "------------------ out-of-place -------------------",
                         "-------------------- in-place ---------------------");
      out << fmt::format("#{:>11} {:>12} {:>8} {:>6} {:>5} {:>18}{}{}\n", "size", "count", "type", "redop", "root", "algo",
                         hdr_place, hdr_place);
      out << fmt::format("#{:>11} {:>12} {:>8} {:>6} {:>5} {:>18}{}{}\n", "(B)", "(elements)", "", "", "", "", hdr_units,
                         hdr_units)
          << std::flush;
    }
    for (size_t c : sec.counts) {
      const CollArgs args = sample_args(sec.op, c, o);
      const Algo chosen = pg.choose_algorithm(args, sec.algo);
      CallOptions co;
      co.algo = sec.algo;
      const size_t size = c * size_multiplier(sec.op, n) * es;
      BenchRecord recs[2];  // out-of-place, in-place
      bool ran[2] = {false, false};
      for (int place = 0; place < 2; ++place) {
        const bool inplace = place == 1;
        if (sec.op == OpKind::kBarrier) {
          if (inplace == o.outofplace) continue;  // barrier has no buffers: one run, in the first enabled column
        } else {
          if (inplace ? !o.inplace : !o.outofplace) continue;
          if (!inplace && !has_out_of_place(sec.op)) continue;
        }
        Case host_case{&bench_coll(sec.op), inplace, c, n, me, op_rooted(sec.op) ? o.root : 0, o.dtype, o.redop, es,
                       sendbuf.data(), recvbuf.data()};
        // With --device the calls run on the device mirrors (same offsets); prepare and verify stay on the host
        // buffers and copy the span every call touches (the row's size in bytes, of each buffer).
        Case call_case = host_case;
        const size_t span = c * size_multiplier(sec.op, n) * es;  // what the host buffers hold of this row
        if (dm) call_case.sendbuf = dsend.data(), call_case.recvbuf = drecv.data();
        struct {
          const Case& h;
          const Case& d;
          const DeviceMemory* dm;
          size_t span;
          void prepare(int iter) const {
            h.prepare(iter);
            if (dm && span) dm->to_device(d.sendbuf, h.sendbuf, span), dm->to_device(d.recvbuf, h.recvbuf, span);
          }
          uint64_t verify(int iter) const {
            if (dm && span) dm->to_host(h.sendbuf, d.sendbuf, span), dm->to_host(h.recvbuf, d.recvbuf, span);
            return h.verify(iter);
          }
          void call(ProcessGroup& g, const CallOptions& co) const { d.call(g, co); }
        } cs{host_case, call_case, dm, span};
        // Warm-up calls (iterations -1, -2, ...) are checked too; the timed ones are 1..iters.
        uint64_t wrong = 0;
        if (!o.check) cs.prepare(0);
        pg.barrier();
        for (int w = 0; w < o.warmup; ++w) {
          if (o.check) {
            cs.prepare(-1 - w);
            pg.barrier();
          }
          cs.call(pg, co);
          if (o.check) wrong += cs.verify(-1 - w);
        }
        pg.barrier();
        // Calls back to back, one timestamp between consecutive calls (latency of call i = stamp i - stamp
        // i-1; their mean is the loop's time per call, as nccl-tests and mpi_bench time a loop). With --check
        // the refill, barrier and verification between calls are outside the stamps around each call.
        std::vector<uint64_t> stamps(static_cast<size_t>(o.iters) * 2);
        const auto c0 = Clock::now();
        const uint64_t s0 = Stamp::now();
        uint64_t prev = s0;
        for (int it = 0; it < o.iters; ++it) {
          if (o.check) {
            cs.prepare(it + 1);
            pg.barrier();
            prev = Stamp::now();
          }
          cs.call(pg, co);
          const uint64_t t = Stamp::now();
          stamps[2 * it] = prev, stamps[2 * it + 1] = t;
          prev = t;
          if (o.check) wrong += cs.verify(it + 1);
        }
        const uint64_t s1 = Stamp::now();
        const auto c1 = Clock::now();
        const double us_per_tick = s1 > s0 ? std::chrono::duration<double, std::micro>(c1 - c0).count() / (s1 - s0) : 0;
        std::vector<double> lat(o.iters);
        for (int it = 0; it < o.iters; ++it) lat[it] = (stamps[2 * it + 1] - stamps[2 * it]) * us_per_tick;
        double mean = 0;
        for (double x : lat) mean += x;
        mean /= o.iters;
        std::sort(lat.begin(), lat.end());
        double stats[4] = {mean, lat.front(), percentile(lat, 0.50), percentile(lat, 0.99)};
        int64_t wrong_all = static_cast<int64_t>(wrong);
        if (n > 1) {
          pg.all_reduce(stats, 4, DType::kFloat64, ReduceOp::kMax);
          pg.all_reduce(&wrong_all, 1, DType::kInt64, ReduceOp::kSum);
        }
        BenchRecord& rec = recs[place];
        rec.op = sec.op;
        rec.algo = chosen;
        rec.algo_forced = sec.algo != Algo::kAuto;
        rec.inplace = inplace;
        rec.size = size;
        rec.count = size / es;
        rec.count_per_rank = sec.op == OpKind::kBarrier ? 0 : c;
        if (sec.op == OpKind::kBarrier) rec.count = 0;
        rec.dtype = o.dtype;
        rec.has_dtype = sec.op != OpKind::kBarrier;
        rec.redop = o.redop;
        rec.has_redop = op_reduces(sec.op);
        rec.root = op_rooted(sec.op) ? o.root : -1;
        rec.time_us = stats[0];
        rec.algbw = stats[0] > 0 ? static_cast<double>(size) / (stats[0] * 1e-6) / 1e9 : 0;
        rec.busbw = rec.algbw * bus_factor(sec.op, n);
        if (o.check) rec.wrong = static_cast<uint64_t>(wrong_all);
        rec.lat_min_us = stats[1];
        rec.lat_p50_us = stats[2];
        rec.lat_p99_us = stats[3];
        rec.world_size = n;
        rec.transport = transport;
        rec.transport_requested = o.transport;
        rec.buffers = o.buffers;
        ran[place] = true;
        result.wrong += static_cast<uint64_t>(wrong_all);
      }
      for (int place = 0; place < 2; ++place)
        if (ran[place]) result.records.push_back(recs[place]);
      if (lead) {
        const BenchRecord& any = ran[0] ? recs[0] : recs[1];
        std::string algo_cell = sec.algo == Algo::kAuto ? fmt::format("auto:{}", algo_name(chosen)) : algo_name(chosen);
        out << fmt::format(" {:>11} {:>12} {:>8} {:>6} {:>5} {:>18}{}{}\n", size, any.count,
                           any.has_dtype ? dtype_name(o.dtype) : "none",
                           any.has_redop ? reduce_op_name(o.redop) : "none", any.root, algo_cell,
                           placement_cells(ran[0] ? &recs[0] : nullptr, o.check),
                           placement_cells(ran[1] ? &recs[1] : nullptr, o.check))
            << std::flush;
      }
    }
  }

  double sum = 0;
  int rows = 0;
  for (const auto& r : result.records)
    if (r.op != OpKind::kBarrier) sum += r.busbw, ++rows;
  result.avg_busbw = rows ? sum / rows : 0;
  if (lead) {
    if (o.check) out << fmt::format("# Out of bounds values : {} {}\n", result.wrong, result.wrong ? "FAILED" : "OK");
    else out << "# Out of bounds values : N/A (not checked; run with --check to verify every element)\n";
    out << fmt::format("# Avg bus bandwidth    : {:.4f} GB/s\n", result.avg_busbw);
    // What the shared-memory transport costs the host: its segments are sparse, so /dev/shm's used blocks
    // are the rings and window pages the ranks touched (the whole host's, other jobs included).
    struct statvfs fs {};
    if (::statvfs("/dev/shm", &fs) == 0)
      out << fmt::format("# /dev/shm in use      : {} MiB of {} MiB (the whole host, at the end of the run)\n",
                         (static_cast<uint64_t>(fs.f_blocks - fs.f_bfree) * fs.f_frsize) >> 20,
                         (static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize) >> 20);
    out << "#\n" << std::flush;
  }
  // Rank 0 writes the JSON, then every rank waits for it: a launcher stops the others as soon as one rank
  // exits non-zero (wrong elements), which must not cut rank 0's output short.
  std::exception_ptr write_error;
  if (lead && (!o.json_path.empty() || !o.tune_path.empty())) {
    try {
      if (!o.json_path.empty()) write_json(o.json_path, result.records);
      if (!o.tune_path.empty()) {
        save_tuning_file(o.tune_path, tuning_from_records(result.records, transport, n));
        out << fmt::format("# tuning file written: {} (use it with TRIDENT_TUNING_FILE={})\n", o.tune_path,
                           o.tune_path)
            << std::flush;
      }
    } catch (...) {
      write_error = std::current_exception();
    }
  }
  if (n > 1) pg.barrier();
  if (write_error) std::rethrow_exception(write_error);
  return result;
}

}  // namespace trident::bench
