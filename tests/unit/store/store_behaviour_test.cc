// One behaviour suite run against every Store: HashStore, FileStore, TCPStore, and PrefixStore over each.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "store_test_util.h"
#include "trident/comm/store/file_store.h"
#include "trident/comm/store/hash_store.h"
#include "trident/comm/store/tcp_store.h"
#include "trident/core/error.h"

namespace trident {
namespace {

using test::TempDir;

Bytes B(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string S(const Bytes& b) { return std::string(b.begin(), b.end()); }

// One store under test; handle() returns a new handle to the same store (a new client, or a new FileStore on
// the same file), which forked children may also call.
class StoreUnderTest {
 public:
  virtual ~StoreUnderTest() = default;
  virtual std::shared_ptr<Store> handle() = 0;
};

class HashUnderTest : public StoreUnderTest {
 public:
  HashUnderTest() : store_(std::make_shared<HashStore>()) { store_->set_timeout(Seconds(30)); }
  std::shared_ptr<Store> handle() override { return store_; }

 private:
  std::shared_ptr<HashStore> store_;
};

class FileUnderTest : public StoreUnderTest {
 public:
  std::shared_ptr<Store> handle() override { return std::make_shared<FileStore>(dir_.path() + "/store", Seconds(30)); }

 private:
  TempDir dir_;
};

class TcpUnderTest : public StoreUnderTest {
 public:
  TcpUnderTest() : server_("127.0.0.1", 0, "test-token") {}
  std::shared_ptr<Store> handle() override {
    return std::make_shared<TCPStore>("127.0.0.1", server_.port(), "test-token", Seconds(30));
  }

 private:
  TCPStoreServer server_;
};

template <typename Inner>
class PrefixUnderTest : public StoreUnderTest {
 public:
  std::shared_ptr<Store> handle() override { return std::make_shared<PrefixStore>("group0/gen1", inner_.handle()); }

 private:
  Inner inner_;
};

template <typename T>
class StoreBehaviour : public ::testing::Test {
 protected:
  T sut_;
};

using StoreKinds = ::testing::Types<HashUnderTest, FileUnderTest, TcpUnderTest, PrefixUnderTest<HashUnderTest>,
                                    PrefixUnderTest<FileUnderTest>, PrefixUnderTest<TcpUnderTest>>;

class KindNames {
 public:
  template <typename T>
  static std::string GetName(int i) {
    const char* names[] = {"Hash", "File", "Tcp", "PrefixHash", "PrefixFile", "PrefixTcp"};
    return names[i];
  }
};
TYPED_TEST_SUITE(StoreBehaviour, StoreKinds, KindNames);

TYPED_TEST(StoreBehaviour, SetThenGetReturnsTheLatestValue) {
  auto s = this->sut_.handle();
  s->set("a", B("one"));
  EXPECT_EQ(S(s->get("a")), "one");
  s->set("a", B("two"));
  EXPECT_EQ(S(s->get("a")), "two");
  Bytes binary = {0, 1, 2, 0, 255, 0};
  s->set("bin", binary);
  EXPECT_EQ(s->get("bin"), binary);
  s->set("empty", Bytes{});
  EXPECT_TRUE(s->check({"empty"}));
  EXPECT_EQ(s->get("empty"), Bytes{});
  // A second handle sees what the first wrote.
  auto other = this->sut_.handle();
  EXPECT_EQ(other->get_string("a"), "two");
}

TYPED_TEST(StoreBehaviour, LargeValueRoundTrips) {
  auto s = this->sut_.handle();
  Bytes big(3 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  s->set("big", big);
  EXPECT_EQ(this->sut_.handle()->get("big"), big);
}

TYPED_TEST(StoreBehaviour, AddFromManyThreadsReachesTheExactTotal) {
  constexpr int kThreads = 8, kAdds = 100;
  auto shared = this->sut_.handle();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Even threads share one handle, odd threads have their own.
      auto s = t % 2 == 0 ? shared : this->sut_.handle();
      for (int i = 0; i < kAdds; ++i) s->add("counter", t + 1);
    });
  }
  for (auto& th : threads) th.join();
  const int64_t expected = int64_t{kAdds} * kThreads * (kThreads + 1) / 2;  // sum over t of (t+1) * kAdds
  EXPECT_EQ(shared->add("counter", 0), expected);
  EXPECT_EQ(shared->get_string("counter"), std::to_string(expected));  // decimal text
  EXPECT_EQ(shared->add("negative", -5), -5);
}

// The stores that processes share (a HashStore lives in one process: forked children get copies).
template <typename T>
class CrossProcessStoreBehaviour : public StoreBehaviour<T> {};
using CrossProcessStoreKinds = ::testing::Types<FileUnderTest, TcpUnderTest, PrefixUnderTest<FileUnderTest>,
                                                PrefixUnderTest<TcpUnderTest>>;
class CrossProcessKindNames {
 public:
  template <typename T>
  static std::string GetName(int i) {
    const char* names[] = {"File", "Tcp", "PrefixFile", "PrefixTcp"};
    return names[i];
  }
};
TYPED_TEST_SUITE(CrossProcessStoreBehaviour, CrossProcessStoreKinds, CrossProcessKindNames);

TYPED_TEST(CrossProcessStoreBehaviour, AddFromForkedProcessesReachesTheExactTotal) {
  constexpr int kProcs = 4, kAdds = 50;
  auto s = this->sut_.handle();
  s->set("ready", B("1"));
  int failed = test::run_forked(kProcs, [&](int rank) {
    auto mine = this->sut_.handle();
    mine->wait({"ready"}, Seconds(30));
    for (int i = 0; i < kAdds; ++i) mine->add("counter", rank + 1);
    mine->set("done/" + std::to_string(rank), B("1"));
    return true;
  });
  EXPECT_EQ(failed, 0);
  std::vector<std::string> done;
  for (int r = 0; r < kProcs; ++r) done.push_back("done/" + std::to_string(r));
  s->wait(done, Seconds(30));
  EXPECT_EQ(s->add("counter", 0), int64_t{kAdds} * kProcs * (kProcs + 1) / 2);
}

TYPED_TEST(StoreBehaviour, AddOnANonIntegerIsAStoreErrorAndTheStoreStaysUsable) {
  auto s = this->sut_.handle();
  s->set("text", B("abc"));
  EXPECT_THROW(s->add("text", 1), StoreError);
  EXPECT_EQ(s->add("n", 2), 2);
}

TYPED_TEST(StoreBehaviour, CompareSetSemantics) {
  auto s = this->sut_.handle();
  // Absent key, empty expected: set.
  EXPECT_EQ(S(s->compare_set("k", Bytes{}, B("first"))), "first");
  EXPECT_EQ(S(s->get("k")), "first");
  // Present key, wrong expected: unchanged, returns the current value.
  EXPECT_EQ(S(s->compare_set("k", B("nope"), B("second"))), "first");
  EXPECT_EQ(S(s->get("k")), "first");
  // Present key, empty expected (means "absent"): unchanged.
  EXPECT_EQ(S(s->compare_set("k", Bytes{}, B("third"))), "first");
  // Present key, right expected: swapped.
  EXPECT_EQ(S(s->compare_set("k", B("first"), B("second"))), "second");
  EXPECT_EQ(S(s->get("k")), "second");
  // Absent key, non-empty expected: nothing set, returns empty.
  EXPECT_EQ(s->compare_set("absent", B("x"), B("y")), Bytes{});
  EXPECT_FALSE(s->check({"absent"}));
}

TYPED_TEST(StoreBehaviour, CompareSetRaceHasExactlyOneWinner) {
  constexpr int kThreads = 6;
  std::atomic<int> winners{0};
  std::vector<std::string> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto s = this->sut_.handle();
      std::string mine = "rank" + std::to_string(t);
      std::string got = S(s->compare_set("leader", Bytes{}, B(mine)));
      if (got == mine) winners++;
      seen[t] = got;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(winners.load(), 1);
  std::string leader = this->sut_.handle()->get_string("leader");
  for (auto& v : seen) EXPECT_EQ(v, leader);
}

TYPED_TEST(StoreBehaviour, WaitSucceedsWhenAnotherThreadSetsTheKeysLater) {
  auto s = this->sut_.handle();
  std::atomic<bool> returned{false};
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(returned.load());
    s->set("later1", B("x"));  // same handle as the waiter
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    this->sut_.handle()->add("later2", 7);
  });
  s->wait({"later1", "later2"}, Seconds(30));
  returned = true;
  setter.join();
  EXPECT_EQ(s->get_string("later2"), "7");
}

TYPED_TEST(StoreBehaviour, GetBlocksUntilTheKeyIsSet) {
  auto s = this->sut_.handle();
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    this->sut_.handle()->set("slow", B("value"));
  });
  EXPECT_EQ(S(s->get("slow", Seconds(30))), "value");
  setter.join();
}

TYPED_TEST(StoreBehaviour, WaitTimesOutNamingTheMissingKey) {
  auto s = this->sut_.handle();
  s->set("present", B("1"));
  try {
    s->wait({"present", "missing_key"}, Seconds(0.2));
    FAIL() << "wait returned without missing_key";
  } catch (const TimeoutError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("missing_key"), std::string::npos) << what;
    EXPECT_EQ(what.find("present"), std::string::npos) << what;  // only the missing key is named
    // c10d's words, as PyTorch's TCPStore and tests match them (" (Timed out|closed|timeout) ").
    EXPECT_NE(what.find("Timed out"), std::string::npos) << what;
  }
  try {
    s->get("never_set", Seconds(0.1));
    FAIL() << "get returned a key that was never set";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("never_set"), std::string::npos) << e.what();
  }
  // The default deadline applies when none is given.
  s->set_timeout(Seconds(0.1));
  EXPECT_THROW(s->wait({"also_missing"}), TimeoutError);
  s->set_timeout(Seconds(30));
  // And the store still works after timeouts.
  s->set("after", B("ok"));
  EXPECT_EQ(s->get_string("after", Seconds(5)), "ok");
}

TYPED_TEST(StoreBehaviour, DeleteKeyAndCheck) {
  auto s = this->sut_.handle();
  EXPECT_TRUE(s->check({}));
  EXPECT_FALSE(s->check({"d"}));
  EXPECT_FALSE(s->delete_key("d"));
  s->set("d", B("v"));
  s->set("e", B("v"));
  EXPECT_TRUE(s->check({"d", "e"}));
  EXPECT_TRUE(s->delete_key("d"));
  EXPECT_FALSE(s->check({"d", "e"}));
  EXPECT_TRUE(s->check({"e"}));
  EXPECT_FALSE(s->delete_key("d"));
  EXPECT_THROW(s->get("d", Seconds(0.05)), TimeoutError);
  // A deleted key can be set again, and add restarts from 0.
  s->add("d", 5);
  EXPECT_EQ(s->add("d", 0), 5);
  EXPECT_TRUE(this->sut_.handle()->check({"d"}));
}

TYPED_TEST(StoreBehaviour, NumKeysCountsDistinctKeys) {
  auto s = this->sut_.handle();
  EXPECT_EQ(s->num_keys(), 0);
  s->set("a", B("1"));
  s->set("b", B("1"));
  s->set("a", B("2"));
  EXPECT_EQ(s->num_keys(), 2);
  s->add("c", 1);
  s->compare_set("d", Bytes{}, B("x"));
  EXPECT_EQ(s->num_keys(), 4);
  s->delete_key("b");
  EXPECT_EQ(this->sut_.handle()->num_keys(), 3);
}

TEST(PrefixStore, PrefixesEveryKeyAndSeparatesNamespaces) {
  auto base = std::make_shared<HashStore>();
  PrefixStore a("pg0", base), b("pg1", base);
  a.set("x", B("from a"));
  b.set("x", B("from b"));
  EXPECT_EQ(a.get_string("x"), "from a");
  EXPECT_EQ(b.get_string("x"), "from b");
  EXPECT_EQ(base->get_string("pg0/x"), "from a");
  EXPECT_EQ(base->get_string("pg1/x"), "from b");
  EXPECT_FALSE(a.check({"y"}));
  base->set("pg0/y", B("1"));
  EXPECT_TRUE(a.check({"y"}));
  PrefixStore nested("inner", std::make_shared<PrefixStore>("outer", base));
  nested.add("n", 3);
  EXPECT_EQ(base->get_string("outer/inner/n"), "3");
}

TEST(FileStore, ManyStoresInOneProcessShareTheFile) {
  TempDir dir;
  FileStore a(dir.path() + "/f"), b(dir.path() + "/f");
  a.set("k", B("v"));
  EXPECT_EQ(b.get_string("k", Seconds(5)), "v");
  EXPECT_TRUE(b.delete_key("k"));
  EXPECT_FALSE(a.check({"k"}));
  EXPECT_EQ(a.num_keys(), 0);
}

TEST(FileStore, CutsATornRecordLeftByADeadWriter) {
  TempDir dir;
  std::string path = dir.path() + "/f";
  {
    FileStore s(path);
    s.set("whole", B("record"));
  }
  // A writer died after writing part of a record header.
  FILE* f = std::fopen(path.c_str(), "ab");
  ASSERT_NE(f, nullptr);
  std::fwrite("TSR1\x05", 1, 5, f);
  std::fclose(f);
  FileStore s(path);
  EXPECT_EQ(s.get_string("whole"), "record");
  s.set("next", B("ok"));  // the exclusive writer cuts the torn tail first
  FileStore fresh(path);
  EXPECT_EQ(fresh.get_string("next"), "ok");
  EXPECT_EQ(fresh.num_keys(), 2);
}

TEST(FileStore, RejectsAFileThatIsNotAStore) {
  TempDir dir;
  std::string path = dir.path() + "/f";
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fputs("this is not a trident store file", f);
  std::fclose(f);
  EXPECT_THROW(FileStore{path}, StoreError);
}

TEST(FileStore, MissingFolderIsAStoreErrorNamingThePath) {
  try {
    FileStore s("/nonexistent-trident-folder/store");
    FAIL();
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-trident-folder/store"), std::string::npos);
  }
}

}  // namespace
}  // namespace trident
