// TCP transport: a full mesh of sockets between the ranks of a process group that need it (ranks on
// other hosts, or every rank when TRIDENT_TRANSPORT=tcp). Sockets are non-blocking, Nagle off, buffers
// as large as the kernel allows (TRIDENT_TCP_SOCKBUF overrides); partial reads and writes are the normal
// case (TRIDENT_TCP_MAX_IO caps every send/recv call so tests can force them). After a call finds its
// socket full or empty, that direction answers 0 for 2 us without a system call (the engine's spin).
//
// Setup is collective over the group through the store (each rank publishes host:port, lower ranks accept
// connections from higher ranks) and has a deadline. A connection that presents the wrong group or a bad
// greeting is dropped and the listener keeps waiting for the right one.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "trident/comm/transport/channel.h"

namespace trident {

class Store;

// Returns channels[peer] for every peer with need[peer] true (others null). `group_id` distinguishes
// groups sharing a store prefix; `rank_names[i]` is how errors name rank i.
std::vector<std::unique_ptr<Channel>> connect_tcp_mesh(Store& store, int rank, int size, const std::vector<bool>& need,
                                                       uint64_t group_id, double timeout_s);

// The address other hosts reach this process at: TRIDENT_SOCKET_ADDR, else the local address of the
// route to MASTER_ADDR, else 127.0.0.1.
std::string local_socket_address();

}  // namespace trident
