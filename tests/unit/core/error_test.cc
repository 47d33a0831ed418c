// copy_error: a Work's error is rethrown to its waiter as a copy made on the waiter's thread. The copy must
// be of exactly the original's type, with every field, its message led by `lead`; an exception of any
// other type (a subclass defined elsewhere, a std:: one) comes back as the very same object. Timeout and
// peer-death errors carry c10d's words.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <typeinfo>

#include "trident/core/error.h"

namespace trident {
namespace {

template <typename T>
T rethrown(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const T& x) {
    if (typeid(x) != typeid(T)) ADD_FAILURE() << "caught a " << typeid(x).name() << ", not exactly the type asked";
    return x;
  } catch (...) {
    ADD_FAILURE() << "not the type asked for";
  }
  throw std::logic_error("unreachable");
}

TEST(CopyError, KeepsTheExactTypeAndEveryField) {
  const auto m = rethrown<MismatchError>(
      copy_error(std::make_exception_ptr(MismatchError("m", 1, 2, "all_reduce", 7, {1, 2})), "lead: "));
  EXPECT_EQ(std::string(m.what()), "lead: m");
  EXPECT_EQ(m.rank, 1);
  EXPECT_EQ(m.peer, 2);
  EXPECT_EQ(m.op, "all_reduce");
  EXPECT_EQ(m.seq, 7);
  EXPECT_EQ(m.ranks, (std::vector<int>{1, 2}));

  const auto t =
      rethrown<TimeoutError>(copy_error(std::make_exception_ptr(TimeoutError("t", 3, "barrier", 9, {0, 4}))));
  EXPECT_EQ(std::string(t.what()), "Timed out - t");  // c10d's words, added once
  EXPECT_EQ(t.rank, 3);
  EXPECT_EQ(t.op, "barrier");
  EXPECT_EQ(t.seq, 9);
  EXPECT_EQ(t.missing, (std::vector<int>{0, 4}));

  const auto d =
      rethrown<PeerDiedError>(copy_error(std::make_exception_ptr(PeerDiedError("d", 0, 5, "send", 2)), "x "));
  EXPECT_EQ(std::string(d.what()), "x Rank 5 failed - Connection closed by peer - d");
  EXPECT_EQ(d.peer, 5);
  const auto n = rethrown<NetworkError>(copy_error(std::make_exception_ptr(NetworkError("n", 1, 0, "recv", 4))));
  EXPECT_EQ(n.op, "recv");
  EXPECT_EQ(n.seq, 4);
  const auto i = rethrown<InvalidArgument>(copy_error(std::make_exception_ptr(InvalidArgument("i")), "a "));
  EXPECT_EQ(std::string(i.what()), "a i");
  EXPECT_EQ(std::string(rethrown<Unsupported>(copy_error(std::make_exception_ptr(Unsupported("u")))).what()), "u");
  EXPECT_EQ(std::string(rethrown<StoreError>(copy_error(std::make_exception_ptr(StoreError("s")))).what()), "s");
  EXPECT_EQ(std::string(rethrown<IoError>(copy_error(std::make_exception_ptr(IoError("o")))).what()), "o");
  EXPECT_EQ(std::string(rethrown<Error>(copy_error(std::make_exception_ptr(Error("e")), "l ")).what()), "l e");
}

// Every TimeoutError and PeerDiedError carries c10d's words for its condition, whoever throws it (the native
// backend's deadlines, the MPI backend, the stores), once: PyTorch's tests match " (Timed out|closed|timeout) ".
TEST(C10dWords, TimeoutAndPeerDiedErrorsCarryThemOnce) {
  EXPECT_EQ(std::string(TimeoutError("store wait ran past 1 s").what()), "Timed out - store wait ran past 1 s");
  EXPECT_EQ(std::string(TimeoutError("Timed out waiting 5ms for x").what()), "Timed out waiting 5ms for x");
  EXPECT_EQ(std::string(PeerDiedError("recv from rank 2 failed", 0, 2).what()),
            "Rank 2 failed - Connection closed by peer - recv from rank 2 failed");
  EXPECT_EQ(std::string(PeerDiedError("a peer left").what()), "Connection closed by peer - a peer left");
  // Copies keep one copy of the words.
  const auto t = rethrown<TimeoutError>(copy_error(std::make_exception_ptr(TimeoutError("t")), "all_reduce: "));
  EXPECT_EQ(std::string(t.what()), "all_reduce: Timed out - t");
}

class OtherError : public Error {
 public:
  using Error::Error;
};

TEST(CopyError, OtherTypesComeBackAsTheSameObject) {
  for (const std::exception_ptr& e : {std::make_exception_ptr(OtherError("sub")),
                                      std::make_exception_ptr(std::runtime_error("std")),
                                      std::make_exception_ptr(42)}) {
    EXPECT_EQ(copy_error(e, "lead "), e);
  }
  EXPECT_EQ(copy_error(nullptr), nullptr);
}

}  // namespace
}  // namespace trident
