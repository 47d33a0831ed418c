// PipelineEngine: runs one training (or evaluation) step of a pipeline-parallel model: this rank's model
// chunks (parallel::Stage, one per virtual stage it holds) driven through a schedule (parallel/schedule.h)
// microbatch by microbatch, activations and their gradients moving between neighbouring virtual stages by
// tagged point-to-point messages on the pipeline group.
//
// Layout: P = pp_group->size() ranks, v = virtual_stages chunks per rank; chunks[c] of pipeline rank p is
// virtual stage c*P + p. Virtual stage s sends its activation to s+1 (rank (p+1) % P; under interleaving the
// last chunk of rank P-1 feeds chunk c+1 of rank 0) and its input gradient back to s-1.
// Communication: every transfer is a tagged send or receive on pp_group itself, to rank p+1 (activations)
// or p-1 (gradients). A group's sends and receives run independently of each other (ProcessGroup), so a
// stage may wait to receive from one neighbour while its sends to either neighbour proceed: no per-direction
// subgroups are needed, and tags match each receive with its send whatever order the two ranks post them.
// (So the native and MPI backends; NCCL runs a group's sends and receives in issue order on one stream,
// comm/backends/nccl_pg.h.)
// Receives are posted ahead of need (for the next kRecvLookahead actions) and waited on when the data is
// needed; sends are asynchronous, polled after every action (their buffers then recycled) and waited on
// only at the end of the step. Tags: (kind, sending virtual stage, mb), distinct within a step.
// P = 1 needs no communication (chunks hand activations over in memory).
//
// Profiling: with trident::timeline() enabled, every Stage::forward/backward is a "forward"/"backward"
// compute span (chunk, mb), and every wait for a transfer a "send_act"/"recv_act"/"send_grad"/"recv_grad"
// comm span carrying the bytes moved (a transfer already complete when checked records a zero-length span;
// so each transfer appears exactly once). Span::chunk is the LOCAL chunk index (virtual stage chunk*P + rank).
//
// Ownership: borrows the stages (must outlive the engine); shares the group. Blocking: run() blocks until
// this rank's part of the step is done and the loss is broadcast. Thread-safety: one thread calls run().
// Timeouts and errors: every wait has the pipeline group's timeout; a peer's failure (dead rank, abort,
// timeout) surfaces as the group's NetworkError/PeerDiedError/TimeoutError. When a step fails on this rank
// (including an exception from a Stage), the engine aborts pp_group so that every other rank fails promptly
// instead of waiting; the engine is then unusable.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "trident/comm/process_group.h"
#include "trident/parallel/schedule.h"
#include "trident/parallel/stage.h"

namespace trident::parallel {

struct PipelineOptions {
  ScheduleKind schedule = ScheduleKind::k1F1B;
  int microbatches = 1;
  int virtual_stages = 1;
};

// Point-to-point traffic of the last run() on this rank.
struct PipelineStats {
  int sends = 0, recvs = 0;
  double bytes_sent = 0, bytes_received = 0;
};

class PipelineEngine {
 public:
  static constexpr int kRecvLookahead = 2;  // actions ahead of the current one whose receives are posted

  // `chunks` has virtual_stages entries (chunk c = virtual stage c*P + rank). Validates the options
  // (schedule arguments, chunk count, first/last stage flags); local (no communication). pp_group may be
  // null for a single-rank pipeline.
  PipelineEngine(std::vector<Stage*> chunks, std::shared_ptr<ProcessGroup> pp_group, PipelineOptions options);
  ~PipelineEngine();
  PipelineEngine(const PipelineEngine&) = delete;
  PipelineEngine& operator=(const PipelineEngine&) = delete;

  // One step over this data-parallel rank's batch of B rows x T positions (tokens/targets [B*T] on every
  // pipeline rank; only the first/last virtual stage read them), split into m microbatches of B/m rows.
  // backward = true: the schedule's forwards and backwards; each microbatch's backward carries
  // loss_scale/m, so parameter gradients ACCUMULATE those of loss_scale * (mean loss over microbatches)
  // (the caller zeroes them). backward = false: forwards only (Stage::forward with keep = false).
  // Returns the mean loss over the m microbatches on every pipeline rank.
  double run(const int32_t* tokens, const int32_t* targets, int B, int T, bool backward, float loss_scale = 1.0f);

  int num_stages() const { return P_; }  // pipeline ranks
  int rank() const { return p_; }
  const PipelineOptions& options() const { return opt_; }
  const Schedule& schedule() const { return schedule_; }  // every rank's actions (this rank's: schedule()[rank()])
  const PipelineStats& last_stats() const { return stats_; }

 private:
  struct Pending;
  int vstage(int chunk) const { return chunk * P_ + p_; }
  uint32_t tag(int kind, int stage, int mb) const;
  std::vector<float> acquire(size_t n);
  void release(std::vector<float>&& buf);
  void fail_all(const std::string& reason);
  void drain_after_failure();

  std::vector<Stage*> chunks_;
  std::shared_ptr<ProcessGroup> pp_;
  PipelineOptions opt_;
  int P_ = 1, p_ = 0;
  Schedule schedule_;
  // Activations go to next_ = (p+1)%P and come from prev_ = (p-1+P)%P; gradients the other way.
  int next_ = 0, prev_ = 0;
  std::vector<std::vector<float>> pool_;
  std::vector<std::unique_ptr<Pending>> sends_;
  std::map<uint32_t, std::unique_ptr<Pending>> recvs_;  // by tag
  std::map<uint32_t, std::vector<float>> local_;        // P = 1: hand-offs between chunks, by tag
  PipelineStats stats_;
  bool failed_ = false;
};

}  // namespace trident::parallel
