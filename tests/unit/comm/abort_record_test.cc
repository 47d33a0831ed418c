// AbortRecord: the one encoding of why a group was aborted, and the typed error every rank raises from it.
#include <gtest/gtest.h>

#include <string>

#include "trident/comm/transport/abort.h"
#include "trident/core/error.h"

namespace trident {
namespace {

AbortRecord sample(AbortRecord::Kind kind) {
  AbortRecord r;
  r.kind = kind;
  r.reporter = 0;
  r.peer = 2;
  r.ranks = {2, 5};
  r.op = "all_reduce";
  r.seq = 41;
  r.message = "rank 2 died during all_reduce";
  return r;
}

TEST(AbortRecord, RoundTripsEveryField) {
  for (auto kind : {AbortRecord::Kind::kOther, AbortRecord::Kind::kMismatch, AbortRecord::Kind::kPeerDied,
                    AbortRecord::Kind::kTimeout}) {
    const AbortRecord r = sample(kind);
    const AbortRecord d = AbortRecord::decode(r.encode());
    EXPECT_EQ(d.kind, r.kind);
    EXPECT_EQ(d.reporter, 0);
    EXPECT_EQ(d.peer, 2);
    EXPECT_EQ(d.ranks, (std::vector<int>{2, 5}));
    EXPECT_EQ(d.op, "all_reduce");
    EXPECT_EQ(d.seq, 41);
    EXPECT_EQ(d.message, r.message);
  }
}

TEST(AbortRecord, LongMessageIsCutToTheLimitAndTheFieldsSurvive) {
  AbortRecord r = sample(AbortRecord::Kind::kPeerDied);
  r.message = std::string(5000, 'x');
  const std::string bytes = r.encode(256);
  EXPECT_EQ(bytes.size(), 256u);
  const AbortRecord d = AbortRecord::decode(bytes);
  EXPECT_EQ(d.kind, AbortRecord::Kind::kPeerDied);
  EXPECT_EQ(d.peer, 2);
  EXPECT_EQ(d.message, std::string(d.message.size(), 'x'));
}

TEST(AbortRecord, ForeignBytesAreAnOtherFailureWithThemAsTheMessage) {
  for (std::string bytes : {std::string("D:rank 2 died"), std::string(), std::string("TAB1\x02", 5)}) {
    const AbortRecord d = AbortRecord::decode(bytes);
    EXPECT_EQ(d.kind, AbortRecord::Kind::kOther);
    EXPECT_EQ(d.peer, -1);
    EXPECT_EQ(d.message, bytes);
  }
}

TEST(AbortRecord, PeerDiedCarriesTheDeadRankOnEveryRank) {
  for (int me : {0, 1, 3}) {
    try {
      sample(AbortRecord::Kind::kPeerDied).raise(me);
      FAIL() << "raise returned";
    } catch (const PeerDiedError& e) {
      EXPECT_EQ(e.rank, me);
      EXPECT_EQ(e.peer, 2);
      EXPECT_EQ(e.op, "all_reduce");
      EXPECT_EQ(e.seq, 41);
    }
  }
}

// Reporter 0 saw rank 2 issue something else: both name ranks {0, 2}; each side's peer is the other one,
// and a third rank's peer is the rank that differed.
TEST(AbortRecord, MismatchNamesBothRanksAndTheOtherSideAsPeer) {
  for (auto [me, want_peer] : {std::pair{0, 2}, std::pair{2, 0}, std::pair{1, 2}}) {
    try {
      sample(AbortRecord::Kind::kMismatch).raise(me);
      FAIL() << "raise returned";
    } catch (const MismatchError& e) {
      EXPECT_EQ(e.rank, me);
      EXPECT_EQ(e.peer, want_peer) << "on rank " << me;
      EXPECT_EQ(e.ranks, (std::vector<int>{0, 2}));
      EXPECT_EQ(e.seq, 41);
    }
  }
}

TEST(AbortRecord, TimeoutCarriesTheRanksNotHeardFrom) {
  try {
    sample(AbortRecord::Kind::kTimeout).raise(1);
    FAIL() << "raise returned";
  } catch (const TimeoutError& e) {
    EXPECT_EQ(e.rank, 1);
    EXPECT_EQ(e.missing, (std::vector<int>{2, 5}));
    EXPECT_EQ(e.op, "all_reduce");
  }
}

TEST(AbortRecord, OtherIsANetworkErrorOfNoSubtype) {
  try {
    sample(AbortRecord::Kind::kOther).raise(1);
    FAIL() << "raise returned";
  } catch (const PeerDiedError&) {
    FAIL() << "an other failure raised as PeerDiedError";
  } catch (const MismatchError&) {
    FAIL() << "an other failure raised as MismatchError";
  } catch (const TimeoutError&) {
    FAIL() << "an other failure raised as TimeoutError";
  } catch (const NetworkError& e) {
    EXPECT_EQ(e.rank, 1);
    EXPECT_EQ(std::string(e.what()), "rank 2 died during all_reduce");
  }
}

}  // namespace
}  // namespace trident
