// LayerRange: THE driver of trident's language models. It runs a contiguous range of a model's blocks
// (the embedding when the range starts the model, units of nn/layers.h, ln_f + head + loss when it ends
// it) over one microbatch at a time, keeping each microbatch's activations from its forward to its
// backward. The single-process model (nn/language_model.h) is the whole range at TP = 1 with one
// microbatch in flight; a pipeline stage of parallel/parallel_model.h is one range of a shard, with as
// many microbatches in flight as its schedule holds.
//
// What it does per microbatch: forward saves the unit inputs x_u (and the units' activations, unless
// activation checkpointing keeps only x_u and recomputes a unit's forward inside backward into one shared
// set; a unit whose activations that set still holds is not recomputed); the last range computes the loss
// and dloss/dlogits in its forward; backward runs the units in reverse, then frees the microbatch. Block
// events (model.h) fire around each block: 0 the embedding, first layer + 1 for a unit, n_layer + 1 the
// head. All buffers are in the env's device memory; backward's scratch lives in env.workspace slots
// kDresSlot, kDlnfSlot and kRecomputeSlot.
//
// Ownership: the range owns its layers and the saved activations; the caller owns the env's model and
// workspace. Blocking: as the layers (tensor-parallel collectives). Thread-safety: one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "trident/nn/layers.h"

namespace trident::nn {

class LayerRange {
 public:
  // Workspace slots used by backward (the layers use lower ones; nn/layers.h).
  static constexpr size_t kDresSlot = 8, kDlnfSlot = 9, kRecomputeSlot = 10;

  // units[i] is the unit starting at global layer unit_layers[i]; n_layer: the model's (for block ids).
  LayerRange(std::optional<Embedding> embedding, std::vector<std::unique_ptr<Layer>> units,
             std::vector<int> unit_layers, std::optional<LmHead> head, int n_layer, int n_embd,
             bool activation_checkpointing);
  ~LayerRange();

  bool is_first() const { return embedding_.has_value(); }
  bool is_last() const { return head_.has_value(); }
  const std::vector<std::unique_ptr<Layer>>& units() const { return units_; }

  // Forward of microbatch mb (B rows of T positions), every pointer in the env's device memory except
  // logits_host. The first range reads tokens[B*T] (input unused), others input[B*T*n_embd]. The last
  // range returns the mean cross-entropy of targets (when not null; 0 otherwise) and, with keep, leaves
  // dloss/dlogits of loss * loss_scale for backward; with logits_host it also writes the full logits
  // [B*T, V] there (gathered over the tensor-parallel group). Other ranges write output[B*T*n_embd] and
  // return 0. keep = false (evaluation) saves nothing.
  double forward(const LayerEnv& e, int mb, const int32_t* tokens, const int32_t* targets, const float* input,
                 float* output, int B, int T, float loss_scale, bool keep, float* logits_host);
  // Backward of a microbatch forward kept: doutput (not the last range) is d output, dinput (not the first)
  // receives d input. Adds into the parameter gradients (hooks fire) and frees the microbatch.
  void backward(const LayerEnv& e, int mb, const float* doutput, float* dinput);
  bool holds(int mb) const { return saved_.count(mb) != 0; }

  size_t activation_bytes() const { return bytes_; }
  size_t peak_activation_bytes() const { return peak_; }
  void reset_peak() { peak_ = bytes_; }

 private:
  struct Saved;
  std::unique_ptr<Saved> take();
  void put_back(std::unique_ptr<Saved> a);
  int unit_block(size_t u) const { return unit_layers_[u] + 1; }

  std::optional<Embedding> embedding_;
  std::vector<std::unique_ptr<Layer>> units_;
  std::vector<int> unit_layers_;
  std::optional<LmHead> head_;
  int n_layer_, C_;
  bool ckpt_;
  std::map<int, std::unique_ptr<Saved>> saved_;
  std::unique_ptr<Saved> spare_;  // the last freed microbatch's buffers, reused by the next forward
  LayerActs shared_;              // unit activations when not kept per microbatch
  uint64_t seq_ = 0;              // forwards run (names the activations `shared_` holds)
  uint64_t shared_seq_ = 0;       // forward whose unit `shared_unit_` `shared_` holds (0: none)
  size_t shared_unit_ = 0;
  size_t bytes_ = 0, peak_ = 0;
};

}  // namespace trident::nn
