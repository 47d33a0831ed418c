// The TCPStore wire format, shared by the server (tcp_store_server.cc) and the client (tcp_store_client.cc).
//
// Every message is a frame: u32 length (little endian) followed by that many payload bytes.
// Request payload: u8 command, then its fields. Fields: str = u32 length + bytes; i64 = 8 bytes LE;
// keys = u32 count + that many str.
//   kAuth        str token                       -> OK
//   kSet         str key, str value              -> OK
//   kGet         str key, i64 timeout_ms         -> OK str value | TIMEOUT
//   kAdd         str key, i64 delta              -> OK i64 new value | ERROR (value not an integer)
//   kCompareSet  str key, str expected, str desired -> OK str value now stored
//   kWait        keys, i64 timeout_ms            -> OK | TIMEOUT
//   kCheck       keys                            -> OK u8 all present
//   kDelete      str key                         -> OK u8 existed
//   kNumKeys                                     -> OK i64
// Reply payload: u8 status (0 OK, 1 ERROR, 2 TIMEOUT, 3 FATAL), then the fields above (OK) or a message.
// FATAL means the server closes the connection after sending it (wrong token, malformed or oversized frame,
// unknown command); ERROR leaves the connection usable.
//
// Internal to comm/store: included by the two .cc files (and the request parser's fuzz target,
// tests/fuzz/, and bench/store_bench.cc for its deliberately half-sent requests). Every function is pure or a local system call; no ownership, no blocking, thread-safe.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "trident/comm/store/store.h"
#include "trident/comm/store/tcp_store.h"

namespace trident::store_wire {

using Clock = std::chrono::steady_clock;

enum Command : uint8_t {
  kAuth = 1,
  kSet = 2,
  kGet = 3,
  kAdd = 4,
  kCompareSet = 5,
  kWait = 6,
  kCheck = 7,
  kDelete = 8,
  kNumKeys = 9,
};
enum Status : uint8_t { kOk = 0, kErrorStatus = 1, kTimeoutStatus = 2, kFatal = 3 };

constexpr int64_t kMaxTimeoutMs = int64_t{1} << 40;  // ~35 years: "forever" without overflow
constexpr auto kAuthDeadline = std::chrono::seconds(30);  // an unauthenticated connection must speak by then
constexpr auto kDrainDeadline = std::chrono::seconds(1);  // after a fatal reply, read leftovers this long

inline void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
inline void put_i64(std::string& out, int64_t v) {
  uint64_t u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xFF));
}
inline void put_str(std::string& out, const void* data, size_t n) {
  put_u32(out, static_cast<uint32_t>(n));
  out.append(static_cast<const char*>(data), n);
}
inline void put_str(std::string& out, const std::string& s) { put_str(out, s.data(), s.size()); }
inline void put_bytes(std::string& out, const Bytes& b) { put_str(out, b.data(), b.size()); }
inline uint32_t read_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

// Bounds-checked field reader; any overrun sets ok = false.
struct Reader {
  std::string_view s;
  size_t pos = 0;
  bool ok = true;
  bool need(size_t n) {
    if (!ok || s.size() - pos < n) ok = false;
    return ok;
  }
  uint8_t u8() { return need(1) ? static_cast<uint8_t>(s[pos++]) : 0; }
  uint32_t u32() {
    if (!need(4)) return 0;
    uint32_t v = read_u32(s.data() + pos);
    pos += 4;
    return v;
  }
  int64_t i64() {
    if (!need(8)) return 0;
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= static_cast<uint64_t>(static_cast<uint8_t>(s[pos + i])) << (8 * i);
    pos += 8;
    return static_cast<int64_t>(u);
  }
  std::string str() {
    uint32_t n = u32();
    if (!need(n)) return {};
    std::string out(s.substr(pos, n));
    pos += n;
    return out;
  }
  bool done() const { return ok && pos == s.size(); }
};

inline std::string frame(const std::string& payload) {
  std::string out;
  out.reserve(4 + payload.size());
  put_u32(out, static_cast<uint32_t>(payload.size()));
  out += payload;
  return out;
}

// Constant-time comparison: the time taken does not depend on where the strings differ.
inline bool tokens_equal(const std::string& a, const std::string& b) {
  size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

inline std::string format_bytes(size_t n) {
  if (n >= (size_t{1} << 20) && n % (size_t{1} << 20) == 0) return fmt::format("{} MiB", n >> 20);
  if (n >= 1024 && n % 1024 == 0) return fmt::format("{} KiB", n >> 10);
  return fmt::format("{} bytes", n);
}

inline int64_t to_ms(Seconds t) {
  double ms = t.count() * 1000.0;
  if (!(ms > 0)) return 0;
  if (ms > static_cast<double>(kMaxTimeoutMs)) return kMaxTimeoutMs;
  return static_cast<int64_t>(ms);
}

inline int ms_until(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (ms < 0) return 0;
  return static_cast<int>(std::min<long long>(ms + 1, 1000 * 1000));
}

inline Clock::time_point deadline_after(Seconds t) {
  double s = std::min(t.count(), 1e9);
  if (!(s > 0)) s = 0;
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(Seconds(s));
}

// One request, decoded (the fields its command carries; the others stay empty).
struct Request {
  Command cmd{};
  std::string token;              // kAuth
  std::string key;                // kSet, kGet, kAdd, kCompareSet, kDelete
  std::string value;              // kSet: the value; kCompareSet: the desired value
  std::string expected;           // kCompareSet
  std::vector<std::string> keys;  // kWait, kCheck
  int64_t number = 0;             // kGet, kWait: timeout in ms (clamped to [0, kMaxTimeoutMs]); kAdd: delta
};

// Decodes one request payload (the bytes after the frame length). Returns false with *error set to what is
// wrong, for the client to read in the fatal reply: an unknown command, a field cut short or bytes left
// over ("malformed request"), or a key over kMaxKeyBytes. Never reads outside `payload`.
inline bool parse_request(std::string_view payload, Request* out, std::string* error) {
  Reader r{payload};
  Request q;
  const uint8_t cmd = r.u8();
  auto malformed = [&] {
    *error = fmt::format("malformed request (command {}, {} bytes)", cmd, payload.size());
    return false;
  };
  auto key_ok = [&](const std::string& key) {
    if (key.size() <= kMaxKeyBytes) return true;
    *error = fmt::format("key of {} bytes exceeds the {} key limit", key.size(), format_bytes(kMaxKeyBytes));
    return false;
  };
  auto read_keys = [&] {
    const uint32_t n = r.u32();
    if (!r.ok || n > payload.size() / 4) return false;  // every key takes at least its 4-byte length
    for (uint32_t i = 0; i < n && r.ok; ++i) q.keys.push_back(r.str());
    return r.ok;
  };
  if (!r.ok) return malformed();
  q.cmd = static_cast<Command>(cmd);
  switch (cmd) {
    case kAuth: q.token = r.str(); break;
    case kSet:
      q.key = r.str();
      q.value = r.str();
      break;
    case kGet:
      q.key = r.str();
      q.number = r.i64();
      break;
    case kWait:
      if (!read_keys()) return malformed();
      q.number = r.i64();
      break;
    case kAdd:
      q.key = r.str();
      q.number = r.i64();
      break;
    case kCompareSet:
      q.key = r.str();
      q.expected = r.str();
      q.value = r.str();
      break;
    case kCheck:
      if (!read_keys()) return malformed();
      break;
    case kDelete: q.key = r.str(); break;
    case kNumKeys: break;
    default:
      *error = fmt::format("unknown command {} (is the client a trident store client of the same version?)", cmd);
      return false;
  }
  if (!r.done()) return malformed();
  if (!key_ok(q.key)) return false;
  for (const auto& k : q.keys)
    if (!key_ok(k)) return false;
  if (cmd == kGet || cmd == kWait) q.number = std::clamp<int64_t>(q.number, 0, kMaxTimeoutMs);
  *out = std::move(q);
  return true;
}

inline void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
}


}  // namespace trident::store_wire
