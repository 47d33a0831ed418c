// The native engine's transport frame header (comm/native/frame.h) on arbitrary bytes: the first 64 bytes
// are a header as a peer's stream would deliver it. A header is accepted or rejected with a reason naming
// the field; an accepted one is described in words without reading out of bounds, and its padding ends
// the frame on a 64-byte boundary without overflow. Inputs shorter than a header are padded with zeros.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "trident/comm/native/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trident::MsgHeader h{};
  std::memcpy(&h, data, size < sizeof h ? size : sizeof h);
  const std::string bad = trident::frame_header_error(h);
  if (!bad.empty()) return 0;
  if (trident::describe_frame_header(h).empty()) std::abort();
  const size_t pad = trident::frame_padding(h.nbytes);
  if (pad >= 64 || (h.nbytes + pad) % 64 != 0 || h.nbytes + pad < h.nbytes) std::abort();
  return 0;
}
