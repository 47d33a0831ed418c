// Checkpoints: safetensors weights that PyTorch loads directly, plus everything needed to resume.
//
// Layout in out_dir:
//   ckpt-<step:08>/model.safetensors      weights, nanoGPT names, PyTorch layout, F32. For a GPT with a tied
//                                         head, "lm_head.weight" is written as a copy of
//                                         "transformer.wte.weight" so GPT.load_state_dict() is strict-clean.
//   ckpt-<step:08>/optimizer.safetensors  AdamW moments per parameter: "exp_avg.<name>", "exp_avg_sq.<name>"
//   ckpt-<step:08>/checkpoint.json        step, model config, tokenizer, train config, optimizer step count,
//                                         data sampler position and RNG state, trainer state, and the size and
//                                         FNV-1a 64 checksum of each file above (verified at load); an
//                                         import from Hugging Face also keeps its config.json ("hf_config")
//   latest                                the name of the newest complete checkpoint folder
// A checkpoint is built in a hidden temporary folder (every file fsync'ed), renamed into place, the folder
// fsync'ed, and only then is `latest` replaced (atomically) and older checkpoints beyond `keep` removed.
// A crash or a full disk at any point leaves the previous checkpoint intact and `latest` naming it.
// Before writing, the file system must have room for the whole checkpoint (statvfs; the previous one stays
// until the new one is complete), and each file's space is reserved before its bytes are written: a full
// disk or a file size limit (RLIMIT_FSIZE) fails with an IoError naming the path and the bytes it needs.
// Folders left by a writer that died mid-write (".ckpt-N.tmp.PID" of a PID no longer running) are removed
// by the next write.
//
// Asynchronous writes: snapshot_checkpoint copies what a checkpoint holds (weights, moments, metadata) into
// memory, and AsyncCheckpointWriter writes that snapshot on a thread while training goes on. Memory: one
// more host copy of the parameters and (with optimizer state) of both AdamW moments while a write runs.
// Streamed writes (CheckpointSnapshot::read): a sharded model (ZeRO-3) is written one tensor at a time, read
// from the shards when the writer reaches it, synchronously; the files are the same.
//
// Ownership: functions copy what they need; AsyncCheckpointWriter owns its thread and the snapshot being
// written. Blocking: synchronous file I/O, except AsyncCheckpointWriter::submit, which waits only for the
// previous write. Thread-safety: do not save into one out_dir from two threads or writers. No timeouts
// (local files).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "trident/nn/model.h"

namespace trident::train {

// --- safetensors ----------------------------------------------------------------------------------------
struct TensorRef {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
  // When data is null: writes the tensor's values (numel floats) into dst, once, when the writer reaches
  // the tensor (a sharded model gathers one tensor at a time).
  std::function<void(float* dst)> fill = nullptr;
};
struct Tensor32 {
  std::vector<int64_t> shape;
  std::vector<float> data;
};
// Writes a safetensors file (8-byte little-endian header length, JSON header padded with spaces to a
// multiple of 8, F32 tensors contiguous in the given order) atomically. Returns the file's FNV-1a 64.
uint64_t write_safetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                           const std::map<std::string, std::string>& metadata,
                           const std::string& previous_note = "the previous file, if any, is intact");
// Reads and validates a safetensors file (F32, BF16, F16 or F64 tensors, converted to float32: a
// checkpoint PyTorch saved in bfloat16 loads directly); throws IoError naming the file and what is wrong
// (truncated, header out of bounds, bad JSON, offsets that overlap or leave holes, unsupported dtype).
std::map<std::string, Tensor32> read_safetensors(const std::string& path,
                                                 std::map<std::string, std::string>* metadata = nullptr);

// --- checkpoints ------------------------------------------------------------------------------------------
struct CheckpointMeta {
  int64_t step = 0;                   // optimizer steps completed
  nlohmann::json model_config;        // Model::config()
  nlohmann::json tokenizer;           // Tokenizer::to_json()
  nlohmann::json train_config;        // TrainConfig::to_json()
  nlohmann::json sampler;             // data position (TrainSampler::state)
  nlohmann::json rng;                 // RNG states
  nlohmann::json trainer;             // trainer bookkeeping (best val loss, elapsed, tokens, ...)
  nlohmann::json hf_config;           // config.json of the Hugging Face model imported (train/hf.h); null
                                      // otherwise (and not written)
  int64_t optimizer_step = 0;         // AdamW step count
  bool has_optimizer = false;
};

struct OptimizerState {
  const std::vector<float>* exp_avg = nullptr;     // flat, model layout
  const std::vector<float>* exp_avg_sq = nullptr;
};

// Saves a checkpoint of `model` (and the optimizer moments when given) as ckpt-<meta.step> in out_dir;
// keeps the newest `keep` checkpoints. Returns the checkpoint folder. Throws IoError (ENOSPC: says that
// the previous checkpoint is intact); InvalidArgument, before writing anything, when a value or moment is
// not finite.
std::string save_checkpoint(const std::string& out_dir, nn::Model& model, const CheckpointMeta& meta,
                            const OptimizerState& opt, int keep = 1);

// What a checkpoint holds, owned: training may change the model while a snapshot is written.
struct CheckpointSnapshot {
  CheckpointMeta meta;
  std::vector<nn::Parameter> parameters;   // names, shapes and offsets into `values`
  std::string model_kind;                  // Model::kind() ("gpt": a tied head is written as lm_head.weight)
  std::vector<float> values;               // the model's flat parameters, on the host
  std::vector<float> exp_avg, exp_avg_sq;  // AdamW moments, model layout; empty: no optimizer state
  // A sharded model's checkpoint, read one tensor at a time instead of held: when set, values and the
  // moments above are empty, and the writer calls read(which, offset, count, dst) for each tensor in file
  // order (which: 0 values, 1 exp_avg, 2 exp_avg_sq; offset and count in the flat layout of `parameters`),
  // the moments only when read_moments. The reads may be collective: every other rank of the group runs
  // the same reads in the same order through drain_checkpoint, and a write that fails part-way runs the
  // reads it has not run yet before it throws, so no rank is left waiting. A non-finite value read fails
  // the save on every rank alike (InvalidArgument, as snapshot_checkpoint's check).
  std::function<void(int which, size_t offset, size_t count, float* dst)> read;
  bool read_moments = false;
};
// Copies the model (from its device) and the moments; InvalidArgument when a value or moment is not finite
// or the moments do not match the model.
CheckpointSnapshot snapshot_checkpoint(nn::Model& model, const CheckpointMeta& meta, const OptimizerState& opt);
// Writes a snapshot as ckpt-<meta.step> in out_dir (as save_checkpoint); returns the folder.
std::string write_checkpoint(const std::string& out_dir, const CheckpointSnapshot& snapshot, int keep = 1);
// On a rank that does not write: runs a streamed snapshot's reads (CheckpointSnapshot::read) in the order
// write_checkpoint runs them on the writer, discarding the values.
void drain_checkpoint(const CheckpointSnapshot& snapshot);
// The folder the checkpoint of `step` has in out_dir.
std::string checkpoint_dir(const std::string& out_dir, int64_t step);

// Writes checkpoints on a background thread, one at a time. An error of a write is rethrown by the next
// submit() or wait(); the destructor waits and logs an error it can no longer throw.
class AsyncCheckpointWriter {
 public:
  AsyncCheckpointWriter() = default;
  ~AsyncCheckpointWriter();
  AsyncCheckpointWriter(const AsyncCheckpointWriter&) = delete;
  AsyncCheckpointWriter& operator=(const AsyncCheckpointWriter&) = delete;
  // Waits for the write in flight (rethrowing its error), then starts writing `snapshot`; returns the folder
  // it will have once complete.
  std::string submit(std::string out_dir, CheckpointSnapshot snapshot, int keep);
  // Blocks until the write in flight, if any, is complete; rethrows its error (once).
  void wait();

 private:
  std::thread thread_;
  std::exception_ptr error_;
};

// Finds a checkpoint folder from a path that is a checkpoint folder, its checkpoint.json, an out_dir or the
// out_dir's `latest` file (for both: the folder `latest` names, else the highest-step ckpt-* folder).
// Returns "" when an out_dir has none.
std::string find_checkpoint(const std::string& path);

struct LoadedCheckpoint {
  std::string dir;
  CheckpointMeta meta;
  std::map<std::string, Tensor32> weights;
  std::map<std::string, Tensor32> optimizer;  // empty when the checkpoint has none
};
// Reads a checkpoint folder, verifying every file's size and checksum; throws IoError naming the file, or
// naming the tensor when one holds a NaN or an infinity.
LoadedCheckpoint load_checkpoint(const std::string& dir, bool with_optimizer = true);

// Copies weights into the model's flat buffer; throws InvalidArgument naming a missing, extra or
// mis-shaped tensor.
void load_weights(nn::Model& model, const std::map<std::string, Tensor32>& weights, const std::string& origin);
// Rebuilds flat moment buffers (model layout, padding zero) from a loaded optimizer file.
void load_optimizer_moments(const nn::Model& model, const std::map<std::string, Tensor32>& tensors,
                            std::vector<float>& exp_avg, std::vector<float>& exp_avg_sq, const std::string& origin);

}  // namespace trident::train
