// The TCP store server's request decoder (comm/store/tcp_store_wire.h parse_request) on arbitrary payloads:
// it must accept or reject with a message, never read out of bounds, and what it accepts must encode back
// to a request it decodes the same way.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "trident/comm/store/tcp_store_wire.h"

using namespace trident::store_wire;

namespace {
std::string encode(const Request& q) {
  std::string out(1, static_cast<char>(q.cmd));
  auto keys = [&] {
    put_u32(out, static_cast<uint32_t>(q.keys.size()));
    for (const auto& k : q.keys) put_str(out, k);
  };
  switch (q.cmd) {
    case kAuth: put_str(out, q.token); break;
    case kSet: put_str(out, q.key), put_str(out, q.value); break;
    case kGet: put_str(out, q.key), put_i64(out, q.number); break;
    case kWait: keys(), put_i64(out, q.number); break;
    case kAdd: put_str(out, q.key), put_i64(out, q.number); break;
    case kCompareSet: put_str(out, q.key), put_str(out, q.expected), put_str(out, q.value); break;
    case kCheck: keys(); break;
    case kDelete: put_str(out, q.key); break;
    case kNumKeys: break;
  }
  return out;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view payload(reinterpret_cast<const char*>(data), size);
  Request q;
  std::string error;
  if (!parse_request(payload, &q, &error)) {
    if (error.empty()) std::abort();  // every rejection says why
    return 0;
  }
  Request again;
  if (!parse_request(encode(q), &again, &error)) std::abort();
  if (again.cmd != q.cmd || again.key != q.key || again.value != q.value || again.expected != q.expected ||
      again.token != q.token || again.keys != q.keys || again.number != q.number)
    std::abort();
  return 0;
}
