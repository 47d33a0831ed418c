// ParallelModel: one rank's shard of a model of any architecture (nn/arch/) under Megatron-LM tensor
// parallelism (tp_group) and pipeline stages (ModelLayout), as an nn::Model plus one parallel::Stage per model chunk. It is the
// single-process model's code with a layout: the parameters are the declarations of nn/model_spec.h
// (this rank's slice of those of its stages: the shard plan), the layers are nn's layers given this rank's
// TP group, and each chunk is an nn::LayerRange (the driver the single-process model runs, over the
// chunk's range of layers and the pipeline's microbatches). What this file adds is the layout (which
// layers and which slices a rank holds), the Stage adapter and the copies between shards and the logical
// model.
//
// Layout: with P pipeline ranks and v virtual stages per rank the n_layer layers split into S = P*v
// contiguous ranges (balanced by count, earlier stages take the remainder, or ModelLayout::stage_layers);
// chunk c of pipeline rank p is virtual stage c*P + p. Virtual stage 0 holds the embedding (wte, wpe),
// stage S-1 ln_f, the head (tied to wte) and the loss. When the first and last stages live on different
// pipeline ranks (P > 1) the last stage keeps its own copy of its wte shard, registered last under the
// same name; sync_tied_gradients() sums the two gradients over embedding_group.
//
// Tensor parallelism over tp_group (T ranks, rank t): each declaration's split (nn/model_spec.h) applied
// to rank t, as the architecture (nn/arch/) declares it; the collectives each layer issues are nn/layers.h's.
//
// Devices: every kernel, the tensor-parallel steps included, goes through the model's op table, so a shard
// runs on any device (config key device). Stage activations (input, output, doutput, dinput) and the
// batch are HOST memory (the pipeline engine's buffers, which its process group sends); a chunk on another
// device copies them in and out. Collectives on device buffers go through a host copy unless the group's
// backend reads device memory (tensor_parallel.h).
//
// Parameters: ONE flat 64-byte-aligned float32 buffer (and a grad buffer) for all chunks, named with the
// logical nanoGPT names and the LOCAL shard shape, registered chunk by chunk in model order; the grad-ready
// hook fires in strictly descending index order within each chunk's backward (every microbatch's backward
// fires it; chunk c's parameters precede chunk c+1's). Values: each rank initialises only its own slices
// (nn::init_slice: each tensor's own seeded stream), which are the single-process model's initial weights
// there; no rank builds the whole model.
//
// nn::Model::forward_backward / forward_logits work when pp_size == 1 (chunks chained in this process,
// microbatch 0; forward_logits all-gathers the vocab shards so every TP rank gets the full logits); with
// pp_size > 1 they throw: drive the chunks with the pipeline engine.
//
// Ownership: the model owns its buffers and its Stages (chunk(c) references stay valid for its lifetime)
// and shares its groups. Blocking: forward/backward block on tp_group collectives; gather_to_full and
// sync_tied_gradients are collectives over the groups they take (group deadlines apply; peer failure
// throws NetworkError). Thread-safety: one thread at a time.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "trident/comm/process_group.h"
#include "trident/nn/flat_model.h"
#include "trident/nn/layers.h"
#include "trident/nn/model_spec.h"
#include "trident/parallel/stage.h"
#include "trident/parallel/tensor_parallel.h"

namespace trident::parallel {

struct ModelLayout {
  int tp_rank = 0, tp_size = 1, pp_rank = 0, pp_size = 1, virtual_stages = 1;
  std::vector<int> stage_layers;  // explicit layers per virtual stage (pp_size * virtual_stages entries); empty = balanced
};

// Where one local parameter lives in the logical (single-process) model: local element (i, j) of a
// [rows, ncols] view is full[row_of(i), col0 + j] of the full tensor viewed as [full_rows, full_cols].
struct ShardSpec {
  std::string name;                  // logical name (nanoGPT; nn/model_spec.h's declaration)
  std::vector<int64_t> shape;        // local shape
  std::vector<int64_t> full_shape;   // logical shape
  std::vector<std::pair<int64_t, int64_t>> row_ranges;  // (begin, count) of full rows, in local order
  int64_t full_cols = 1, col0 = 0, ncols = 1;
  bool replicated = false;  // identical on every TP rank (LayerNorm, row-parallel bias, wpe)
  bool tied_copy = false;   // the last stage's copy of the wte shard (the first stage's is authoritative)
  int chunk = 0;            // local chunk that owns it
  int layer = -1;           // global layer index, -1 for embedding / head / ln_f
  nn::Role role = nn::Role::kWte;
  nn::ParamDecl decl;       // the logical tensor's declaration (its initialisation)
};

class ParallelModel final : public nn::FlatModel {
 public:
  // Throws InvalidArgument naming what would work when `layout` cannot shard `config`.
  static void validate_layout(const nlohmann::json& config, const ModelLayout& layout);
  // The local parameters of (config, layout) in registration order, without building the model.
  static std::vector<ShardSpec> shard_plan(const nlohmann::json& config, const ModelLayout& layout);
  // [first, end) global layers of virtual stage s (of pp_size * virtual_stages).
  static std::pair<int, int> stage_layer_range(const nlohmann::json& config, const ModelLayout& layout, int s);

  ParallelModel(nn::ModelConfig cfg, ModelLayout layout, std::shared_ptr<ProcessGroup> tp_group,
                std::shared_ptr<ProcessGroup> embedding_group);
  ~ParallelModel() override;

  // nn::Model (forward_backward / forward_logits: pp_size == 1 only).
  float forward_backward(const int32_t* inputs, const int32_t* targets, int B, int T, bool backward,
                         float loss_scale = 1.0f) override;
  void forward_logits(const int32_t* inputs, int B, int T, float* logits) override;

  const ModelLayout& layout() const { return layout_; }
  const std::vector<ShardSpec>& shard_specs() const { return specs_; }
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  Stage& chunk(int c);
  int virtual_stage(int c) const { return c * layout_.pp_size + layout_.pp_rank; }
  std::pair<int, int> chunk_layers(int c) const;  // [first, end) global layers of chunk c

  // Sums the gradient of the wte shard between the first and last stage over embedding_group (no-op
  // when the group is null, e.g. pp_size * virtual_stages == 1 or this rank holds neither, and when the
  // model's head is untied).
  void sync_tied_gradients();

  // Copies this rank's slices of `full` (same config: build it with nn::make_model(config)).
  void load_from_full(const nn::Model& full);
  // Collective over the tp x pp ranks of one data-parallel replica (every rank calls): `root` (a rank of
  // model_parallel_group) receives every slice and writes full->param_data() (full may be null elsewhere).
  void gather_to_full(nn::Model* full, ProcessGroup& model_parallel_group, int root);
  // As gather_to_full, for gradients into full->grad_data() (call sync_tied_gradients() first when P > 1).
  void gather_grads_to_full(nn::Model* full, ProcessGroup& model_parallel_group, int root);

  // Sum of squares of this rank's gradients counting each logical element once over the tp x pp ranks
  // (replicated tensors only on tp_rank 0, the tied wte only on the first stage).
  double grad_sum_squares() const;

  // Internal: one chunk (defined in parallel_model.cc).
  class Chunk;

 private:
  friend class Chunk;
  // What nn's layers run with for microbatch mb of chunk c.
  nn::LayerEnv env(int mb, int c);

  void gather_impl(nn::Model* full, ProcessGroup& group, int root, bool grads);
  double run_chunks(const int32_t* inputs, const int32_t* targets, int B, int T, bool backward, float loss_scale,
                    float* full_logits);

  ModelLayout layout_;
  TpComm tp_;
  std::shared_ptr<ProcessGroup> embedding_group_;
  std::vector<ShardSpec> specs_;
  nn::ParamIndex ix_;  // where this shard's declarations landed
  std::vector<std::unique_ptr<Chunk>> chunks_;
  int64_t v0_ = 0, vl_ = 0;  // this rank's vocab rows
  nn::LayerActs workspace_;  // the layers' and the chunks' backward scratch (shared by the chunks)
};

// Builds the shard of (config, layout) for any architecture (config keys as nn::make_model), initialised
// with the single-process model's initial weights (its own slices of them only). tp_group: this rank's tensor-parallel group (null when
// tp_size == 1); embedding_group: first + last pipeline stage ranks of this TP rank (null when
// pp_size == 1 or this rank is neither).
std::unique_ptr<ParallelModel> make_parallel_model(const nlohmann::json& model_config, const ModelLayout& layout,
                                                   std::shared_ptr<ProcessGroup> tp_group,
                                                   std::shared_ptr<ProcessGroup> embedding_group);

}  // namespace trident::parallel
