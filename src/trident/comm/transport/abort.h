// Why a group was aborted, as every rank of it learns it. The rank that detects a failure (a dead peer, a
// mismatched collective, an expired deadline) records one AbortRecord in the group's shared-memory segment
// and in the store; every other rank reads it back and throws the same typed error with the same fields
// (PeerDiedError::peer, MismatchError::ranks, TimeoutError::missing), whichever rank noticed first.
// encode()/decode() are the only place its bytes are written and read; raise() the only place it becomes
// an exception. Ranks are group ranks. A plain value: no ownership, thread-safe as any value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace trident {

struct AbortRecord {
  enum class Kind : uint8_t { kOther = 0, kMismatch = 1, kPeerDied = 2, kTimeout = 3 };
  Kind kind = Kind::kOther;
  int reporter = -1;       // the group rank that recorded it
  int peer = -1;           // kPeerDied: the dead rank; kMismatch: the rank whose call differs from the reporter's
  std::vector<int> ranks;  // kTimeout: the ranks not heard from
  std::string op;          // the collective ("" when not in one)
  long seq = -1;           // its sequence number (-1 when not in one)
  std::string message;

  // At most max_bytes (the message is cut to fit).
  std::string encode(size_t max_bytes = 2048) const;
  // A record from encode(); anything else (an older peer, a foreign writer) becomes kOther with the bytes as
  // its message.
  static AbortRecord decode(std::string_view bytes);
  // Throws the typed error as seen from group rank `rank`: PeerDiedError, MismatchError, TimeoutError or
  // NetworkError, each with this record's fields.
  [[noreturn]] void raise(int rank) const;
};

}  // namespace trident
