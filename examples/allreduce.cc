// All-reduce of a user's buffer: every rank contributes its own vector, every rank gets the sum.
// Run: trident launch -n 2 -- ./allreduce   (or under torchrun/mpirun/Slurm; one process alone also works)
#include <trident/comm/process_group.h>
#include <trident/core/error.h>

#include <cstdio>
#include <vector>

int main() {
  try {
    // Rank, world size and the rendezvous store come from the launcher's environment.
    std::shared_ptr<trident::ProcessGroup> pg = trident::init_process_group();
    const int rank = pg->rank(), world = pg->size();
    std::vector<float> grad(1 << 20);
    for (size_t i = 0; i < grad.size(); ++i) grad[i] = float(rank + 1) * float(i % 7);
    pg->all_reduce(grad.data(), grad.size(), trident::DType::kFloat32, trident::ReduceOp::kSum);
    const float ranks_sum = float(world * (world + 1) / 2);
    for (size_t i = 0; i < grad.size(); ++i) {
      if (grad[i] != ranks_sum * float(i % 7)) {
        std::fprintf(stderr, "rank %d: element %zu is %g, expected %g\n", rank, i, grad[i], ranks_sum * float(i % 7));
        return 1;
      }
    }
    std::printf("rank %d of %d: all_reduce of %zu floats ok\n", rank, world, grad.size());
    pg->barrier();
    return 0;
  } catch (const trident::Error& e) {  // PeerDiedError, TimeoutError, ... name the rank and the collective
    std::fprintf(stderr, "allreduce example failed: %s\n", e.what());
    return 1;
  }
}
