// The calibration behind the prediction `trident train` prints before it trains: the figures only the real
// model, the real process group and this machine can give (forward+backward time of a micro-batch, AdamW
// rate, all-reduce bus rate; per pipeline stage, forward and backward times, activation bytes, hand-off
// latency and bandwidth, the cores the run receives). The model that turns them into a step time, memory
// and traffic is plan/step_model.h; docs/ARCHITECTURE.md ("The model of step time") gives the reasoning.
//
// Ownership: plain values; calibration leaves the model's parameters unchanged and its gradients zero.
// Blocking: calibrate() and calibrate_model_parallel() run compute and collectives on the calling thread and
// are collective (every rank of `pg` / of the mesh calls them together, before training). Thread-safety:
// none needed. Timeouts: the groups' own. Errors: the groups' typed errors propagate.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "trident/comm/process_group.h"
#include "trident/core/timeline.h"
#include "trident/nn/model.h"
#include "trident/parallel/mesh.h"
#include "trident/parallel/parallel_model.h"
#include "trident/plan/step_model.h"

namespace trident::train {

// Times the real model (and the real group when pg is non-null and has more than one rank): one warm-up
// and two timed forward_backward calls of one micro-batch, AdamW on a slice of scratch memory, and (N > 1)
// two all-reduces of the gradient buffer in place, the faster, the slowest rank's view.
plan::Calibration calibrate(nn::Model& model, int batch, int block, int vocab, ProcessGroup* pg);

// Times each local chunk's forward and backward of microbatches of `rows` x `block` (rounds of 2 forwards
// then their 2 backwards, every rank at the same moment: a barrier on the world before each round; one
// warm-up round, then the median of 16 actions of each kind), the p2p ping-pong (P > 1) and the DP
// all-reduce of the gradients (dp > 1); all-gathers the per-stage times (max over the TP and DP replicas)
// so every rank returns the same stage vectors. Leaves gradients zero and the stages' activation peaks
// reset. With more than one rank it also measures the cores the run receives (every rank computes over the
// same 3 x 10 ms windows: sum of CPU / window) and, when ranks outnumber `cores` (0: the host's), a
// hand-off while the others compute. `rehearse` (optional): runs one real forward+backward step of the run
// (the pipeline engine over `microbatches` microbatches); called 1 + 3 times, gradients zeroed after.
plan::StageCalibration calibrate_model_parallel(parallel::ParallelModel& pm, const parallel::DeviceMesh& mesh,
                                                int rows, int block, int vocab, int cores = 0,
                                                const std::function<void()>& rehearse = {}, int microbatches = 1);

// Peak (VmHWM) and current (VmRSS) resident set size of this process, bytes; 0 when unknown.
double peak_rss_bytes();
double current_rss_bytes();

// Processor time of this process (CLOCK_PROCESS_CPUTIME_ID), seconds.
double process_cpu_seconds();

// Mean duration of this rank's "forward" and "backward" compute spans per local chunk (Span::chunk) inside
// the windows [t0, t1): the measured per-microbatch times to replay through the schedule. 0 where none.
void mean_chunk_times(const std::vector<Span>& spans, const std::vector<std::pair<int64_t, int64_t>>& windows,
                      int chunks, std::vector<double>* forward_s, std::vector<double>* backward_s);

}  // namespace trident::train
