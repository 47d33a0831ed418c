// Transport frames of the native engine: every message on a channel (TCP or shared memory) is a 64-byte
// header, then `nbytes` of payload, then zero padding to a multiple of 64 bytes. The header is the first
// thing read from bytes another process wrote, so it is checked on its own before anything trusts it
// (frame_header_error), and described in words for errors (describe_frame_header). Header-only, above
// comm/types.h alone, so the fuzz target of these checks (tests/fuzz/fuzz_frame_header.cc) links only the
// core and comm_types layers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "trident/comm/types.h"

namespace trident {

// Wire header of every message: 64 bytes, little-endian as the host writes it (ranks share an ABI).
struct MsgHeader {
  uint32_t magic;
  uint8_t kind;  // 1 collective, 2 point-to-point
  uint8_t op, dtype, redop;
  uint8_t algo;
  uint8_t pad0[3];
  int32_t root;
  uint32_t step;
  uint32_t tag;
  int32_t src;
  uint64_t seq;
  uint64_t count;
  uint64_t nbytes;
  uint8_t pad1[8];
};
static_assert(sizeof(MsgHeader) == 64);

inline constexpr uint32_t kMsgMagic = 0x5452444d;  // "TRDM"
inline constexpr uint8_t kKindColl = 1;
inline constexpr uint8_t kKindP2P = 2;
// No payload is this large (2^56 bytes): a larger nbytes is corruption, and it keeps the padded length
// below 2^64 (a payload near 2^64 would round to a tiny frame).
inline constexpr uint64_t kMaxFramePayload = uint64_t{1} << 56;

// Zero padding after a payload of `nbytes` (valid headers only: nbytes <= kMaxFramePayload).
inline size_t frame_padding(uint64_t nbytes) { return static_cast<size_t>(((nbytes + 63) & ~uint64_t{63}) - nbytes); }

// Empty when `h` can open a frame of this protocol; else why not, naming the field (the engine adds the
// group and peer and fails the group: the stream is out of sync).
inline std::string frame_header_error(const MsgHeader& h) {
  if (h.magic != kMsgMagic) return fmt::format("magic {:#x} (expected {:#x})", h.magic, kMsgMagic);
  if (h.kind != kKindColl && h.kind != kKindP2P)
    return fmt::format("message kind {} (expected {} collective or {} point-to-point)", h.kind, kKindColl, kKindP2P);
  if (h.nbytes > kMaxFramePayload) return fmt::format("payload of {} bytes (at most {})", h.nbytes, kMaxFramePayload);
  return {};
}

// What a header says, for mismatch errors: "all_reduce(count=7, float32, sum) [algorithm ring]". Any
// field value is printable (unknown ones read "?" / "unknown").
inline std::string describe_frame_header(const MsgHeader& h) {
  return fmt::format("{} [algorithm {}]", describe(fingerprint_args(h.op, h.dtype, h.redop, h.root, h.count)),
                     algo_name(static_cast<Algo>(h.algo)));
}

}  // namespace trident
