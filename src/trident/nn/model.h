// The model interface the trainer and the parallel wrappers program against.
//
// Parameters live in ONE flat float32 buffer and their gradients in another (same layout, each tensor
// 64-byte aligned inside), so DDP buckets and ZeRO shards are views into them. A model owns its buffers.
// forward_backward() is single-threaded from the caller's view (kernels may use the BLAS thread pool).
// The grad-ready hook fires during backward the moment a parameter's gradient is final for this
// micro-step (in reverse order of production), so communication can start early.
//
// Contract details the trainer and the parallel wrappers rely on:
// - Build models with make_model(json) from trident/nn/models.h (keys listed there; model_config_keys()
//   names them so a trainer can pick them out of its own config). Optimizer: trident/optim/adamw.h,
//   schedule and clipping: trident/optim/schedule.h.
// - parameters() is in nanoGPT's named_parameters() order; hooks fire exactly once per parameter per
//   backward, in strictly DESCENDING index order (so flat-buffer offsets are produced high to low).
//   The tied wte is last (its gradient is final only after the embedding backward).
// - forward_backward returns the UNSCALED mean loss; gradients are those of loss * loss_scale.
// - Padding elements of the flat buffers (between 64-byte-aligned tensors) stay 0 in values and grads.
// - Kernels use their own thread pool: call trident::kernels::cpu::set_num_threads(n) (kernels/cpu/ops.h)
//   once per process (1 per rank when ranks share a host).
// - Blocks (for ZeRO-3 / FSDP-style parameter sharding): blocks() lists the model's blocks in forward
//   order, each with the parameters its forward and backward read (a parameter may appear in several
//   blocks: the GPT's tied wte is read by the embedding block and the head block). The block hook fires
//   on the calling thread before and after each block's forward and backward, and around the forward
//   recomputed under activation checkpointing, so a wrapper can materialise a block's parameters just
//   before they are read and free them after. Models without blocks return {} and never fire it.
// - set_zero_grad_releases_pages(true) lets zero_grad() hand the gradient buffer's whole pages back to
//   the OS (madvise MADV_DONTNEED: they read back as zero) instead of writing zeros, so gradient memory
//   released by ZeRO-2/3 stays released; values are identical either way.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trident/core/error.h"
#include "trident/kernels/device.h"

namespace trident::nn {

struct Parameter {
  std::string name;             // nanoGPT's naming, e.g. "transformer.h.0.attn.c_attn.weight"
  std::vector<int64_t> shape;   // PyTorch layout: Linear weights are [out, in]
  size_t offset = 0;            // element offset into the flat value/grad buffers
  size_t numel = 0;
  bool weight_decay = false;    // nanoGPT's groups: decay only tensors with >= 2 dims
};

class Model {
 public:
  virtual ~Model() = default;

  virtual const std::vector<Parameter>& parameters() const = 0;
  virtual float* param_data() = 0;   // flat buffer of all parameters
  virtual float* grad_data() = 0;    // flat buffer of all gradients (same layout)
  virtual size_t num_params() const = 0;  // elements in the flat buffers (including alignment padding)
  // Where param_data() and grad_data() live: on kCuda they are device pointers (copy them through
  // kernels::device_ops(device())). Inputs, targets and logits of the calls below are HOST memory on
  // every device (the model copies the tokens over, B*T int32 per call, as llm.c's gpt2_forward does).
  virtual kernels::Device device() const { return kernels::Device::kCpu; }

  // Mean cross-entropy over B*T positions of inputs[B*T] predicting targets[B*T].
  // With backward=true, ADDS the gradients of that loss into grad_data() (call zero_grad() between steps;
  // gradient accumulation scales the loss by the caller's choice via `loss_scale`).
  virtual float forward_backward(const int32_t* inputs, const int32_t* targets, int B, int T, bool backward,
                                 float loss_scale = 1.0f) = 0;
  // Logits [B, T, vocab] of the forward pass, for sampling and parity checks.
  virtual void forward_logits(const int32_t* inputs, int B, int T, float* logits) = 0;
  virtual void zero_grad() = 0;

  // Called with the index (into parameters()) of each parameter whose gradient just became final.
  using GradReadyHook = std::function<void(size_t param_index)>;
  virtual void set_grad_ready_hook(GradReadyHook hook) = 0;

  virtual nlohmann::json config() const = 0;  // enough to rebuild the model (saved with checkpoints)
  virtual std::string kind() const = 0;       // "gpt" | "mlp"

  // ---- blocks (optional; defaults: no blocks, hook never fires) ----
  struct Block {
    std::string name;            // e.g. "embedding", "transformer.h.3", "head"
    std::vector<size_t> params;  // indices into parameters() read by this block's forward and backward
  };
  enum class BlockEvent : uint8_t {
    kBeforeForward,
    kAfterForward,
    kBeforeBackward,
    kAfterBackward,
    kBeforeRecompute,  // activation checkpointing: the block's forward again, inside the backward pass
    kAfterRecompute,
  };
  virtual std::vector<Block> blocks() const { return {}; }
  using BlockHook = std::function<void(int block, BlockEvent event)>;
  virtual void set_block_hook(BlockHook hook) {}
  virtual void set_zero_grad_releases_pages(bool release) {}

  // ---- gradient storage (optional; default: the model keeps its own buffer) ----
  // Moves the flat gradient buffer into `storage` (num_params() floats, 64-byte aligned), copying the
  // gradients held now; the model holds `owner` (which keeps `storage` alive) while it uses it. Data
  // parallelism hands it memory its process group reduces in place (ProcessGroup::alloc_shared); zero_grad()
  // and release_pages() free shared pages too (MADV_REMOVE). Returns false when the model cannot.
  virtual bool adopt_grad_storage(float* storage, std::shared_ptr<void> owner) { return false; }

  // ---- deferred initialization (optional) ----
  // False for a model built without its initial values (make_model(config, false)): its parameters read as
  // zero until initialize_range() fills what its owner needs. ZeRO-3 initializes only the pieces each rank
  // owns, so no rank ever holds the whole model: the values equal a fully initialized model's, because
  // every tensor draws from its own seeded stream (flat_model.h).
  virtual bool initialized() const { return true; }
  // Writes the initial values of flat elements [begin, end) into param_data() (padding stays zero); throws
  // Unsupported when the model cannot. (Inline, as every virtual here: nn::Model has no key function, so
  // code that only handles models, such as the checkpoint files, links without the nn library.)
  virtual void initialize_range(size_t begin, size_t end) {
    TRIDENT_THROW(Unsupported,
                  "model kind '{}' cannot initialize a part of its parameters ([{}, {}): deferred initialization); "
                  "build it initialized",
                  kind(), begin, end);
  }
};

const char* block_event_name(Model::BlockEvent e);

}  // namespace trident::nn
