// Hardware catalog: GPUs, links, node shapes and hosts (CPU machines such as this one) as data.
//
// The built-in entries are compiled in (HardwareCatalog::builtin()), so the binary works anywhere;
// share/trident/hardware/*.json holds the same entries as data (a test keeps them equal) and is the
// template for user files. load_dir()/load_file() merge user JSON entries by name (a user entry with
// a built-in's name replaces it). A catalog is a plain value: copyable, not thread-safe for concurrent
// mutation, never blocks (file loading reads local files only).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trident/plan/comm_cost.h"

namespace trident::plan {

struct GpuSpec {
  std::string name;
  double memory_bytes = 0;
  double peak_bf16_flops = 0;  // dense tensor-core peak (fp16 is the same on these parts)
  double peak_fp16_flops = 0;
  double peak_tf32_flops = 0;
  double peak_fp32_flops = 0;  // non-tensor-core FP32
  double hbm_Bps = 0;
  double matmul_efficiency = 0.7;  // achievable fraction of peak for large GEMMs (calibratable)
  std::string intra_link = "nvlink4";  // default NVLink/NVSwitch link class of this part
  // trident's own kernels, as fractions of the peaks above (bench_cuda on an H200, 2026-11-28; the same
  // defaults for every part until measured there): attention's model FLOPs (4 h s per token and layer,
  // the causal half not subtracted) at T = 1024, head dim 64, forward and backward on tensor cores; and
  // the elementwise kernels' bytes (layernorm, GELU, softmax + cross-entropy) against hbm.
  double attention_fwd_efficiency = 0.18;
  double attention_bwd_efficiency = 0.11;
  double elementwise_efficiency = 0.47;
};

struct LinkCatalogEntry {
  LinkSpec spec;           // bandwidth per direction, latency
  double bidirectional_Bps = 0;
  std::string kind;        // "nvlink" | "nvswitch" | "pcie" | "infiniband" | "ethernet" | "shm"
};

struct NodeSpec {
  std::string name;
  std::string gpu;
  int gpus_per_node = 8;
  int nics_per_node = 8;
  std::string intra_link;  // e.g. "nvswitch-h100": every GPU pair at full NVLink bandwidth
  std::string nic_link;    // e.g. "ib-ndr": per NIC
};

// A CPU machine (such as the one trident's tests run on): the planner models each rank as one core.
struct HostSpec {
  std::string name;
  int cpu_cores = 1;
  double memcpy_Bps_per_core = 0;
  double sgemm_flops_avx512 = 0;  // single-thread SGEMM
  double sgemm_flops_avx2 = 0;
  double memory_bytes = 0;
  std::string intra_link = "shm";
};

class HardwareCatalog {
 public:
  static HardwareCatalog builtin();

  // Merges every *.json file of `dir` (sorted by name). Throws IoError naming the file on bad JSON or
  // a bad entry. A missing directory is an error only when `must_exist`.
  void load_dir(const std::string& dir, bool must_exist);
  void load_file(const std::string& path);
  void merge_json(const nlohmann::json& j, const std::string& origin);
  nlohmann::json to_json() const;

  // Lookups throw InvalidArgument naming the unknown entry and listing the known ones.
  const GpuSpec& gpu(const std::string& name) const;
  const LinkCatalogEntry& link(const std::string& name) const;
  const NodeSpec& node(const std::string& name) const;
  const HostSpec& host(const std::string& name) const;
  bool has_gpu(const std::string& name) const;
  bool has_link(const std::string& name) const;

  const std::vector<GpuSpec>& gpus() const { return gpus_; }
  const std::vector<LinkCatalogEntry>& links() const { return links_; }
  const std::vector<NodeSpec>& nodes() const { return nodes_; }
  const std::vector<HostSpec>& hosts() const { return hosts_; }

 private:
  std::vector<GpuSpec> gpus_;
  std::vector<LinkCatalogEntry> links_;
  std::vector<NodeSpec> nodes_;
  std::vector<HostSpec> hosts_;
};

// The host entry for the machine we run on: "this-machine" with the SGEMM rate chosen by the CPU's ISA
// (AVX-512 when present) and the core count from the OS.
HostSpec this_machine(const HardwareCatalog& cat);

// The built-in GPU entry a CUDA device name denotes ("NVIDIA H100 80GB HBM3" -> "h100-sxm"), matched on the
// part's name; empty when it is not one of them: H100 PCIe and NVL, whose peaks are lower than the SXM's,
// and every other GPU (a user's catalog entry is then what gives a peak: `trident plan --hardware-dir`).
std::string gpu_for_device_name(const std::string& device_name);

}  // namespace trident::plan
