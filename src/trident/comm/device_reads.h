// The device path's data movement: ranks of one host run a collective by reading and reducing each other's
// device buffers directly (CUDA IPC mappings, comm/device_memory.h), in one or two phases. ProcessGroup
// owns the handshake (exporting and mapping the buffers, checking that every rank issued the same call) and
// the phase barriers; this file holds, for each collective the path takes, which reads each rank does.
#pragma once

#include <functional>
#include <vector>

#include "trident/comm/device_memory.h"
#include "trident/comm/types.h"

namespace trident {

// Every rank's buffers of one call as this rank addresses them (its own as given, peers' mapped), and the
// phase boundary: this rank's device work done and every rank past the same point.
struct DeviceReads {
  const DeviceMemory* dm = nullptr;
  const CollArgs* args = nullptr;
  int rank = 0, size = 1;
  std::vector<const char*> send;
  std::vector<char*> recv;
  std::function<void()> phase_done;
};

// Whether the device path has a read pattern for `op` (the collectives it takes; others stage).
bool device_reads_support(OpKind op);
// Runs the call's read pattern; ends with a phase_done(), after which the caller's buffers are its own again.
void run_device_reads(const DeviceReads& r);

}  // namespace trident
