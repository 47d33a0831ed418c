// The planner: evaluates a parallel layout (TP x PP x DP, ZeRO stage, microbatches, recomputation) of a
// model on a cluster with the closed-form cost model, enumerates candidate layouts and recommends one by
// a fixed decision ladder (docs/PLANNER.md, "Recommendation").
//
// Pure functions on values: no ownership, no blocking, thread-safe, no timeouts. Invalid layouts throw
// InvalidArgument naming the flag and the allowed values.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trident/plan/comm_cost.h"
#include "trident/plan/hardware.h"
#include "trident/plan/model.h"

namespace trident::plan {

// A cluster of identical devices. `device_*` come from a GpuSpec (or a HostSpec for CPU ranks).
struct ClusterSpec {
  std::string device = "h100-sxm";
  double device_memory_bytes = 80.0 * (1ull << 30);
  double peak_flops = 989e12;       // for the chosen precision (MFU's denominator)
  double matmul_efficiency = 0.7;   // achievable fraction of peak
  double attention_fwd_efficiency = 0.7, attention_bwd_efficiency = 0.7;  // attention's FLOPs, fraction of peak
  double elementwise_Bps = 0;       // bytes/s of the elementwise kernels (0: their traffic is not modelled)
  double hbm_Bps = 3.35e12;
  int gpus = 8;
  int gpus_per_node = 8;
  int nics_per_node = 8;
  LinkSpec intra{"nvswitch-h100", 450e9, 3e-6};  // within a node (NVLink/NVSwitch domain, shm)
  LinkSpec nic{"ib-ndr", 50e9, 5e-6};            // one NIC, per direction
  double memory_headroom = 0.10;  // fraction of device memory kept free (allocator, workspaces, comm buffers)
  // Optimizer offload's two rates (defaults, not measured here): the device <-> host link one GPU's copies
  // run at (PCIe Gen4 x16 in practice; Gen5 about twice), and the host memory bandwidth the CPU's AdamW
  // streams its state at, per GPU.
  double host_link_Bps = 25e9;
  double host_memory_Bps = 100e9;

  int nodes() const { return (gpus + gpus_per_node - 1) / gpus_per_node; }
  double usable_memory() const { return device_memory_bytes * (1 - memory_headroom); }
  // Inter-node bandwidth available to ONE rank when every rank of a node talks at once.
  LinkSpec inter_per_rank() const;
};

// Builds a cluster from the catalog: `gpu` (a GPU name or a host name such as "this-machine"),
// `node` shape (empty = DGX-like default for the GPU), `gpus` total, overrides for gpus_per_node,
// intra/inter link names (empty = the node's).
ClusterSpec make_cluster(const HardwareCatalog& cat, const std::string& gpu, int gpus, int gpus_per_node = 0,
                         const std::string& node = "", const std::string& intra_link = "",
                         const std::string& inter_link = "", Precision precision = Precision::kMixed);

struct TrainSpec {
  ModelSpec model;
  int global_batch = 512;  // sequences per optimizer step
  Precision precision = Precision::kMixed;
  bool sequence_parallel = false;
  // The elementwise kernels' traffic (model.h, layer_traffic_per_token): bytes of a stored activation (0: the
  // precision's, 2 mixed and 4 fp32) and of the rounded copy each GEMM makes of a float32 operand (0: none).
  // trident's CUDA bf16 today: float32 activations (4), bf16 copies (2).
  double activation_bytes = 0;
  double operand_copy_bytes = 0;
};


struct Layout {
  int tp = 1, pp = 1, dp = 1;
  int zero = 0;           // ZeRO stage 0..3 over the DP group
  int micro_batch = 1;    // sequences per microbatch
  int microbatches = 1;   // per DP rank per step (gradient accumulation steps without PP)
  Recompute recompute = Recompute::kNone;
  Schedule schedule = Schedule::k1F1B;
  int interleave = 1;     // virtual stages per rank (interleaved schedule)
  // Optimizer offload (--offload optimizer): each rank's Adam moments and master weights (its ZeRO shard)
  // in host memory and its update on the CPU, after the backward (model_state_bytes).
  bool offload = false;
  std::string str() const;
};

// Seconds of one microbatch on one rank: `layers` transformer layers (+ the LM head when `head`); forward,
// and backward with what the layout recomputes. GEMM FLOPs at peak x matmul_efficiency, attention's at its
// own efficiencies, the elementwise kernels' bytes at elementwise_Bps. The planner and the simulator both
// charge compute this way.
struct ComputeTime {
  double forward_s = 0, backward_s = 0;
  double gemm_s = 0, attention_s = 0, elementwise_s = 0;  // forward + backward, the parts of the sum
};
ComputeTime compute_time(const TrainSpec& t, const ClusterSpec& c, const Layout& l, int layers, bool head);

struct CommItem {
  std::string kind;   // "tp_all_reduce", "pp_send_recv", "dp_all_reduce", "zero_reduce_scatter", ...
  std::string link;   // the link class it runs on
  std::string algorithm;
  double bytes_per_gpu = 0;  // bytes each GPU sends per step
  double time_s = 0;         // busy time per step
  double exposed_s = 0;      // part not hidden behind compute
};

struct Evaluation {
  Layout layout;
  MemoryBreakdown memory;  // the most loaded rank (first or last pipeline stage): device and host bytes
  bool fits = false;       // memory.total() (the device's) <= the cluster's usable device memory
  double model_flops_per_iter = 0;
  double hardware_flops_per_iter = 0;
  double compute_s = 0;        // per step on the busiest stage, without bubble
  double bubble_fraction = 0;  // of the step
  double bubble_s = 0;
  double step_time_s = 0;
  double tokens_per_s = 0;
  double tflops_per_gpu = 0;   // model FLOP/s per GPU / 1e12
  double mfu = 0;
  std::vector<CommItem> comm;
  std::vector<std::string> warnings;
  nlohmann::json to_json() const;
};

// Checks a layout against the model and cluster; throws InvalidArgument naming the flag (--tp, --pp,
// --dp, --zero, --microbatches, --micro-batch) and the allowed values.
void validate_layout(const TrainSpec& t, const ClusterSpec& c, const Layout& l);
Evaluation evaluate(const TrainSpec& t, const ClusterSpec& c, const Layout& l);

// Every valid layout: TP dividing heads (and KV heads) within the NVLink domain, PP dividing layers,
// DP = the rest dividing the global batch, ZeRO 0-3, recompute none/selective/full.
std::vector<Evaluation> enumerate_layouts(const TrainSpec& t, const ClusterSpec& c, int micro_batch = 1);

struct Recommendation {
  bool found = false;
  Evaluation best;                  // by the framework
  Evaluation fastest;               // by predicted step time among fitting layouts
  std::vector<std::string> reasons;
};
Recommendation recommend(const TrainSpec& t, const ClusterSpec& c, const std::vector<Evaluation>& all);

// Device memory of one layout against the cluster's devices: the figures `trident train --device cuda`
// checks before it allocates anything and `trident plan` prints (evaluate()'s memory, one arithmetic).
struct MemoryCheck {
  bool fits = false;
  double needed_bytes = 0;  // the most loaded rank's device memory (Evaluation::memory.total())
  double usable_bytes = 0;  // the device's memory less the headroom (ClusterSpec::usable_memory())
  double device_bytes = 0;  // the device's memory
  double host_bytes = 0;    // what optimizer offload keeps in host memory per rank
  MemoryBreakdown memory;
  // When it does not fit: what to change, in the train command's flags, each with the device bytes it
  // would need (offload, ZeRO-3 over the same ranks, half the micro-batch, activation checkpointing).
  std::string advice;
  std::string str() const;  // one line: needed vs usable, the parts, and the advice when it does not fit
};
MemoryCheck check_memory(const TrainSpec& t, const ClusterSpec& c, const Layout& l);

// Tensor-parallel traffic, counted as payloads: Megatron's f/g operators do 2 all-reduces in forward
// and 2 in backward per layer, each on the [b, s, h] activation (b s h x bytes); the step's TP traffic is
// the sum of those payloads: 4 x L x b x s x h x bytes.
double tp_traffic_bytes(const ModelSpec& m, int batch, int bytes_per_element);

}  // namespace trident::plan
