#include "trident/comm/transport/abort.h"

#include <algorithm>
#include <cstring>

#include "trident/core/error.h"

namespace trident {
namespace {

constexpr char kMagic[4] = {'T', 'A', 'B', '1'};

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

template <class T>
bool take(std::string_view& in, T* v) {
  if (in.size() < sizeof(T)) return false;
  std::memcpy(v, in.data(), sizeof(T));
  in.remove_prefix(sizeof(T));
  return true;
}

}  // namespace

std::string AbortRecord::encode(size_t max_bytes) const {
  std::string out(kMagic, sizeof kMagic);
  put<uint8_t>(out, static_cast<uint8_t>(kind));
  put<int32_t>(out, reporter);
  put<int32_t>(out, peer);
  put<int64_t>(out, seq);
  put<uint16_t>(out, static_cast<uint16_t>(std::min<size_t>(op.size(), 255)));
  out.append(op.data(), std::min<size_t>(op.size(), 255));
  const size_t nranks = std::min<size_t>(ranks.size(), 64);
  put<uint16_t>(out, static_cast<uint16_t>(nranks));
  for (size_t i = 0; i < nranks; ++i) put<int32_t>(out, ranks[i]);
  const size_t room = max_bytes > out.size() ? max_bytes - out.size() : 0;
  out.append(message.data(), std::min(message.size(), room));
  return out;
}

AbortRecord AbortRecord::decode(std::string_view bytes) {
  AbortRecord r;
  std::string_view in = bytes;
  uint8_t kind = 0;
  int32_t reporter = -1, peer = -1;
  int64_t seq = -1;
  uint16_t nop = 0, nranks = 0;
  bool ok = in.size() >= sizeof kMagic && std::memcmp(in.data(), kMagic, sizeof kMagic) == 0;
  if (ok) in.remove_prefix(sizeof kMagic);
  ok = ok && take(in, &kind) && kind <= static_cast<uint8_t>(Kind::kTimeout) && take(in, &reporter) &&
       take(in, &peer) && take(in, &seq) && take(in, &nop) && in.size() >= nop;
  if (ok) {
    r.op.assign(in.data(), nop);
    in.remove_prefix(nop);
    ok = take(in, &nranks);
  }
  for (uint16_t i = 0; ok && i < nranks; ++i) {
    int32_t v = 0;
    ok = take(in, &v);
    r.ranks.push_back(v);
  }
  if (!ok) {
    AbortRecord other;
    other.message = std::string(bytes);
    return other;
  }
  r.kind = static_cast<Kind>(kind);
  r.reporter = reporter;
  r.peer = peer;
  r.seq = seq;
  r.message = std::string(in);
  return r;
}

void AbortRecord::raise(int rank) const {
  switch (kind) {
    case Kind::kMismatch: {
      // The two ranks whose calls differ; from a third rank's view, the peer is the one that differed.
      const int other = rank == peer ? reporter : peer;
      std::vector<int> both{reporter};
      if (peer >= 0) both.push_back(peer);
      std::sort(both.begin(), both.end());
      throw MismatchError(message, rank, other, op, seq, std::move(both));
    }
    case Kind::kPeerDied: throw PeerDiedError(message, rank, peer, op, seq);
    case Kind::kTimeout: throw TimeoutError(message, rank, op, seq, ranks);
    case Kind::kOther: break;
  }
  throw NetworkError(message, rank, peer, op, seq);
}

}  // namespace trident
