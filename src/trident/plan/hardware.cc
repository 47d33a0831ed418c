#include "trident/plan/hardware.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <thread>

#include "trident/core/error.h"

namespace trident::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kT = 1e12;
constexpr double kG = 1e9;

template <typename T, typename F>
void upsert(std::vector<T>& v, T item, F name_of) {
  for (auto& x : v) {
    if (name_of(x) == name_of(item)) {
      x = std::move(item);
      return;
    }
  }
  v.push_back(std::move(item));
}

template <typename T, typename F>
std::string names(const std::vector<T>& v, F name_of) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : ", ") + name_of(x);
  return s;
}

double num(const nlohmann::json& e, const char* key, double fallback, const std::string& origin) {
  if (!e.contains(key)) return fallback;
  if (!e[key].is_number())
    TRIDENT_THROW(IoError, "hardware catalog {}: field '{}' of entry '{}' must be a number", origin, key,
                  e.value("name", std::string("?")));
  return e[key].get<double>();
}

std::string str(const nlohmann::json& e, const char* key, const std::string& fallback) {
  return e.contains(key) && e[key].is_string() ? e[key].get<std::string>() : fallback;
}

}  // namespace

HardwareCatalog HardwareCatalog::builtin() {
  HardwareCatalog c;
  // GPUs: NVIDIA data sheets (dense, without sparsity). Memory as nvidia-smi reports it.
  c.gpus_ = {
      {"a100-40gb", 40 * kGiB, 312 * kT, 312 * kT, 156 * kT, 19.5 * kT, 1555 * kG, 0.7, "nvswitch-a100"},
      {"a100-80gb", 80 * kGiB, 312 * kT, 312 * kT, 156 * kT, 19.5 * kT, 2039 * kG, 0.7, "nvswitch-a100"},
      {"h100-sxm", 80 * kGiB, 989 * kT, 989 * kT, 495 * kT, 67 * kT, 3350 * kG, 0.7, "nvswitch-h100"},
      {"h200", 141 * kG, 989 * kT, 989 * kT, 495 * kT, 67 * kT, 4800 * kG, 0.7, "nvswitch-h100"},
  };
  // Links: bandwidth per direction; alpha is a per-step latency including the software stack. Rows of
  // plain values, each made into an entry: a braced list of the entries themselves (a std::string inside a
  // struct inside a struct) makes GCC 12 at -O2 and above warn that its strings may be used uninitialized.
  struct LinkRow {
    const char* name;
    double Bps, latency_s, bidirectional_Bps;
    const char* kind;
  };
  static const LinkRow kLinks[] = {
      {"nvlink3", 300 * kG, 2e-6, 600 * kG, "nvlink"},          // A100: 12 links x 25 GB/s
      {"nvlink4", 450 * kG, 2e-6, 900 * kG, "nvlink"},          // H100: 18 links x 25 GB/s
      {"nvswitch-a100", 300 * kG, 3e-6, 600 * kG, "nvswitch"},  // 8-GPU NVSwitch domain, NVLink3 per GPU
      {"nvswitch-h100", 450 * kG, 3e-6, 900 * kG, "nvswitch"},  // 8-GPU NVSwitch domain, NVLink4 per GPU
      {"pcie4-x16", 32 * kG, 3e-6, 64 * kG, "pcie"},
      {"pcie5-x16", 64 * kG, 3e-6, 128 * kG, "pcie"},
      {"ib-hdr", 25 * kG, 5e-6, 50 * kG, "infiniband"},  // 200 Gb/s
      {"ib-ndr", 50 * kG, 5e-6, 100 * kG, "infiniband"},  // 400 Gb/s
      {"eth-100g", 12.5 * kG, 30e-6, 25 * kG, "ethernet"},
      {"eth-400g", 50 * kG, 10e-6, 100 * kG, "ethernet"},
      // This machine's ranks talk through shared memory: two copies at ~45 GB/s per core.
      {"shm", 22.5 * kG, 5e-6, 45 * kG, "shm"},
      {"tcp-loopback", 4 * kG, 20e-6, 8 * kG, "ethernet"},
  };
  for (const LinkRow& r : kLinks) {
    LinkCatalogEntry l;
    l.spec = {r.name, r.Bps, r.latency_s};
    l.bidirectional_Bps = r.bidirectional_Bps;
    l.kind = r.kind;
    c.links_.push_back(std::move(l));
  }
  c.nodes_ = {
      {"dgx-a100", "a100-80gb", 8, 8, "nvswitch-a100", "ib-hdr"},
      {"dgx-h100", "h100-sxm", 8, 8, "nvswitch-h100", "ib-ndr"},
  };
  c.hosts_ = {
      {"this-machine", 2, 45 * kG, 200 * kG, 105 * kG, 23 * kGiB, "shm"},
  };
  return c;
}

void HardwareCatalog::merge_json(const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object()) TRIDENT_THROW(IoError, "hardware catalog {}: expected a JSON object with gpus/links/nodes/hosts", origin);
  auto need_name = [&](const nlohmann::json& e, const char* what) {
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string())
      TRIDENT_THROW(IoError, "hardware catalog {}: every {} entry needs a string \"name\"", origin, what);
    return e["name"].get<std::string>();
  };
  for (auto& e : j.value("gpus", nlohmann::json::array())) {
    GpuSpec g;
    g.name = need_name(e, "gpus");
    if (has_gpu(g.name)) g = gpu(g.name);  // partial override keeps the other fields
    g.memory_bytes = num(e, "memory_gib", g.memory_bytes / kGiB, origin) * kGiB;
    g.peak_bf16_flops = num(e, "peak_bf16_tflops", g.peak_bf16_flops / kT, origin) * kT;
    g.peak_fp16_flops = num(e, "peak_fp16_tflops", g.peak_fp16_flops / kT, origin) * kT;
    g.peak_tf32_flops = num(e, "peak_tf32_tflops", g.peak_tf32_flops / kT, origin) * kT;
    g.peak_fp32_flops = num(e, "peak_fp32_tflops", g.peak_fp32_flops / kT, origin) * kT;
    g.hbm_Bps = num(e, "hbm_gbps", g.hbm_Bps / kG, origin) * kG;
    g.matmul_efficiency = num(e, "matmul_efficiency", g.matmul_efficiency, origin);
    g.intra_link = str(e, "intra_link", g.intra_link);
    g.attention_fwd_efficiency = num(e, "attention_fwd_efficiency", g.attention_fwd_efficiency, origin);
    g.attention_bwd_efficiency = num(e, "attention_bwd_efficiency", g.attention_bwd_efficiency, origin);
    g.elementwise_efficiency = num(e, "elementwise_efficiency", g.elementwise_efficiency, origin);
    for (double f : {g.matmul_efficiency, g.attention_fwd_efficiency, g.attention_bwd_efficiency, g.elementwise_efficiency})
      if (!(f > 0 && f <= 1))
        TRIDENT_THROW(IoError, "hardware catalog {}: gpu '{}': every *_efficiency must be in (0, 1] (a fraction of the peak)",
                      origin, g.name);
    if (g.memory_bytes <= 0 || g.peak_bf16_flops <= 0)
      TRIDENT_THROW(IoError, "hardware catalog {}: gpu '{}' needs memory_gib > 0 and peak_bf16_tflops > 0", origin, g.name);
    upsert(gpus_, g, [](const GpuSpec& x) { return x.name; });
  }
  for (auto& e : j.value("links", nlohmann::json::array())) {
    LinkCatalogEntry l;
    l.spec.name = need_name(e, "links");
    if (has_link(l.spec.name)) l = link(l.spec.name);
    l.spec.bandwidth_Bps = num(e, "bandwidth_gbps", l.spec.bandwidth_Bps / kG, origin) * kG;
    l.bidirectional_Bps = num(e, "bidirectional_gbps", l.bidirectional_Bps / kG, origin) * kG;
    l.spec.latency_s = num(e, "latency_us", l.spec.latency_s * 1e6, origin) * 1e-6;
    l.kind = str(e, "kind", l.kind);
    if (l.spec.bandwidth_Bps <= 0)
      TRIDENT_THROW(IoError, "hardware catalog {}: link '{}' needs bandwidth_gbps > 0", origin, l.spec.name);
    if (l.bidirectional_Bps <= 0) l.bidirectional_Bps = 2 * l.spec.bandwidth_Bps;
    upsert(links_, l, [](const LinkCatalogEntry& x) { return x.spec.name; });
  }
  for (auto& e : j.value("nodes", nlohmann::json::array())) {
    NodeSpec n;
    n.name = need_name(e, "nodes");
    for (auto& x : nodes_)
      if (x.name == n.name) n = x;
    n.gpu = str(e, "gpu", n.gpu);
    n.gpus_per_node = int(num(e, "gpus_per_node", n.gpus_per_node, origin));
    n.nics_per_node = int(num(e, "nics_per_node", n.nics_per_node, origin));
    n.intra_link = str(e, "intra_link", n.intra_link);
    n.nic_link = str(e, "nic_link", n.nic_link);
    if (n.gpus_per_node <= 0 || n.nics_per_node <= 0)
      TRIDENT_THROW(IoError, "hardware catalog {}: node '{}' needs gpus_per_node and nics_per_node > 0", origin, n.name);
    upsert(nodes_, n, [](const NodeSpec& x) { return x.name; });
  }
  for (auto& e : j.value("hosts", nlohmann::json::array())) {
    HostSpec h;
    h.name = need_name(e, "hosts");
    for (auto& x : hosts_)
      if (x.name == h.name) h = x;
    h.cpu_cores = int(num(e, "cpu_cores", h.cpu_cores, origin));
    h.memcpy_Bps_per_core = num(e, "memcpy_gbps_per_core", h.memcpy_Bps_per_core / kG, origin) * kG;
    h.sgemm_flops_avx512 = num(e, "sgemm_gflops_avx512", h.sgemm_flops_avx512 / kG, origin) * kG;
    h.sgemm_flops_avx2 = num(e, "sgemm_gflops_avx2", h.sgemm_flops_avx2 / kG, origin) * kG;
    h.memory_bytes = num(e, "memory_gib", h.memory_bytes / kGiB, origin) * kGiB;
    h.intra_link = str(e, "intra_link", h.intra_link);
    upsert(hosts_, h, [](const HostSpec& x) { return x.name; });
  }
}

nlohmann::json HardwareCatalog::to_json() const {
  nlohmann::json j;
  j["gpus"] = nlohmann::json::array();
  for (auto& g : gpus_)
    j["gpus"].push_back({{"name", g.name},
                         {"memory_gib", g.memory_bytes / kGiB},
                         {"peak_bf16_tflops", g.peak_bf16_flops / kT},
                         {"peak_fp16_tflops", g.peak_fp16_flops / kT},
                         {"peak_tf32_tflops", g.peak_tf32_flops / kT},
                         {"peak_fp32_tflops", g.peak_fp32_flops / kT},
                         {"hbm_gbps", g.hbm_Bps / kG},
                         {"matmul_efficiency", g.matmul_efficiency},
                         {"intra_link", g.intra_link},
                         {"attention_fwd_efficiency", g.attention_fwd_efficiency},
                         {"attention_bwd_efficiency", g.attention_bwd_efficiency},
                         {"elementwise_efficiency", g.elementwise_efficiency}});
  j["links"] = nlohmann::json::array();
  for (auto& l : links_)
    j["links"].push_back({{"name", l.spec.name},
                          {"kind", l.kind},
                          {"bandwidth_gbps", l.spec.bandwidth_Bps / kG},
                          {"bidirectional_gbps", l.bidirectional_Bps / kG},
                          {"latency_us", l.spec.latency_s * 1e6}});
  j["nodes"] = nlohmann::json::array();
  for (auto& n : nodes_)
    j["nodes"].push_back({{"name", n.name},
                          {"gpu", n.gpu},
                          {"gpus_per_node", n.gpus_per_node},
                          {"nics_per_node", n.nics_per_node},
                          {"intra_link", n.intra_link},
                          {"nic_link", n.nic_link}});
  j["hosts"] = nlohmann::json::array();
  for (auto& h : hosts_)
    j["hosts"].push_back({{"name", h.name},
                          {"cpu_cores", h.cpu_cores},
                          {"memcpy_gbps_per_core", h.memcpy_Bps_per_core / kG},
                          {"sgemm_gflops_avx512", h.sgemm_flops_avx512 / kG},
                          {"sgemm_gflops_avx2", h.sgemm_flops_avx2 / kG},
                          {"memory_gib", h.memory_bytes / kGiB},
                          {"intra_link", h.intra_link}});
  return j;
}

void HardwareCatalog::load_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) TRIDENT_THROW(IoError, "hardware catalog: cannot open '{}'", path);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    TRIDENT_THROW(IoError, "hardware catalog '{}': invalid JSON: {}", path, e.what());
  }
  merge_json(j, path);
}

void HardwareCatalog::load_dir(const std::string& dir, bool must_exist) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    if (must_exist) TRIDENT_THROW(IoError, "--catalog: '{}' is not a directory of *.json hardware files", dir);
    return;
  }
  std::vector<std::string> files;
  for (auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  for (auto& f : files) load_file(f);
}

const GpuSpec& HardwareCatalog::gpu(const std::string& name) const {
  for (auto& g : gpus_)
    if (g.name == name) return g;
  TRIDENT_THROW(InvalidArgument, "--gpu: unknown GPU '{}'; known: {} (add your own with --catalog DIR)", name,
                names(gpus_, [](const GpuSpec& x) { return x.name; }));
}
const LinkCatalogEntry& HardwareCatalog::link(const std::string& name) const {
  for (auto& l : links_)
    if (l.spec.name == name) return l;
  TRIDENT_THROW(InvalidArgument, "unknown link '{}'; known: {} (add your own with --catalog DIR)", name,
                names(links_, [](const LinkCatalogEntry& x) { return x.spec.name; }));
}
const NodeSpec& HardwareCatalog::node(const std::string& name) const {
  for (auto& n : nodes_)
    if (n.name == name) return n;
  TRIDENT_THROW(InvalidArgument, "--node: unknown node shape '{}'; known: {}", name,
                names(nodes_, [](const NodeSpec& x) { return x.name; }));
}
const HostSpec& HardwareCatalog::host(const std::string& name) const {
  for (auto& h : hosts_)
    if (h.name == name) return h;
  TRIDENT_THROW(InvalidArgument, "unknown host '{}'; known: {}", name,
                names(hosts_, [](const HostSpec& x) { return x.name; }));
}
bool HardwareCatalog::has_gpu(const std::string& name) const {
  return std::any_of(gpus_.begin(), gpus_.end(), [&](auto& g) { return g.name == name; });
}
bool HardwareCatalog::has_link(const std::string& name) const {
  return std::any_of(links_.begin(), links_.end(), [&](auto& l) { return l.spec.name == name; });
}

HostSpec this_machine(const HardwareCatalog& cat) {
  HostSpec h = cat.host("this-machine");
  unsigned n = std::thread::hardware_concurrency();
  if (n > 0) h.cpu_cores = int(n);
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f")) h.sgemm_flops_avx512 = h.sgemm_flops_avx2;
#endif
  return h;
}

std::string gpu_for_device_name(const std::string& device_name) {
  std::string n = device_name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  if (has("h200")) return "h200";
  if (has("h100")) return has("pcie") || has("nvl") ? std::string() : "h100-sxm";
  if (has("a100")) return has("80gb") ? "a100-80gb" : "a100-40gb";
  return {};
}

}  // namespace trident::plan
