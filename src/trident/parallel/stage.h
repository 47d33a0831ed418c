// One pipeline stage's piece of a model, run microbatch by microbatch (the contract between the model
// shards of tensor/pipeline parallelism and the pipeline engine, parallel/pipeline.h).
//
// A rank holds one Stage per model chunk: with P pipeline ranks and v virtual stages per rank, chunk c of
// pipeline rank p is virtual stage c*P + p (Megatron-LM's interleaving); v = 1 is the plain pipeline.
// The first virtual stage owns the embedding (reads tokens), the last owns the final LayerNorm, the head
// and the loss (reads targets). Between stages flows one float32 activation of activation_numel(B, T)
// elements (B x T x n_embd for the GPT) and, backwards, its gradient of the same size.
//
// Microbatch ids are the caller's (0..m-1 within one step); a stage keeps the saved activations of every
// microbatch it has run forward and not yet backward (so 1F1B holds at most P of them, GPipe m), and frees
// them in backward. Parameter gradients ACCUMULATE over microbatches (the caller zeroes them per step).
// Tensor parallelism, when the stage is sharded, happens inside forward/backward on the stage's own group.
//
// Ownership: the model that created a Stage owns it. Blocking: forward/backward compute on the calling
// thread (and block on the stage's tensor-parallel collectives). Thread-safety: one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>

namespace trident::parallel {

class Stage {
 public:
  virtual ~Stage() = default;

  virtual bool is_first() const = 0;  // owns the embedding: forward reads `tokens`, backward writes no dinput
  virtual bool is_last() const = 0;   // owns the head and loss: forward reads `targets`, backward no doutput
  // Floats of the activation this stage receives from the previous one (and sends to the next), per
  // microbatch of B rows of T positions.
  virtual size_t activation_numel(int B, int T) const = 0;

  // Forward of microbatch `mb`. The first stage reads tokens[B*T] (input is null); others read
  // input[activation_numel]. Non-last stages write output[activation_numel] and return 0; the last stage
  // returns the mean cross-entropy over its B*T positions of targets[B*T] (UNSCALED); its backward will
  // produce the gradients of loss * loss_scale. With keep = false (evaluation) nothing is saved for backward.
  virtual double forward(int mb, const int32_t* tokens, const int32_t* targets, const float* input, float* output,
                         int B, int T, float loss_scale, bool keep = true) = 0;
  // Backward of microbatch `mb` (forward must have run with keep = true): doutput is the gradient of this
  // stage's output (null on the last stage), dinput receives the gradient of its input (null on the first
  // stage). Adds into the parameter gradients and frees the microbatch's saved activations.
  virtual void backward(int mb, const float* doutput, float* dinput) = 0;

  // Bytes of saved activations currently held (all microbatches), and the peak since reset_peak().
  virtual size_t activation_bytes() const = 0;
  virtual size_t peak_activation_bytes() const = 0;
  virtual void reset_peak() = 0;
};

}  // namespace trident::parallel
