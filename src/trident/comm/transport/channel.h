// Channel: a full-duplex byte stream between this rank and one peer, the whole transport interface the
// engine needs (STYLE.md #4, reduced to what our engine uses: framing, matching and waiting live in the
// engine, once, for every transport).
//
// Ownership: owned by the engine of one process group; used by one thread at a time (the group's
// executing thread). Blocking: never — every call moves what it can and returns. Errors: a broken
// connection throws NetworkError naming the peer. Waiting for activity is the transport's wait_* hook.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace trident {

class Channel {
 public:
  virtual ~Channel() = default;
  // Writes up to n bytes; returns how many were taken (0 when the stream is full). The engine always
  // writes 64-byte units except at the very end of a frame, where it writes a padded 64-byte unit.
  virtual size_t write_some(const void* data, size_t n) = 0;
  // Reads up to n bytes into data; returns how many (0 when nothing is available).
  virtual size_t read_some(void* data, size_t n) = 0;
  // Zero-copy read: a contiguous span of readable bytes (possibly empty), valid until consume().
  virtual std::span<const uint8_t> peek() = 0;
  virtual void consume(size_t n) = 0;
  // File descriptor to poll for readability/writability (TCP), or -1 (shared memory uses the doorbell).
  virtual int fd() const { return -1; }
  virtual bool is_shm() const { return false; }
  // Best-effort teardown so the peer notices at once (TCP: shutdown; shm: nothing).
  virtual void shutdown() {}
  virtual std::string describe() const = 0;  // "shm", "tcp 10.0.0.2:40123"
};

}  // namespace trident
