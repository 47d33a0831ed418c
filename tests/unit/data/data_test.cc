// Tokenizers, the token cache, nanoGPT's split and the samplers (determinism and rank sharding).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "harness/skip.h"
#include "trident/core/error.h"
#include "trident/data/dataset.h"
#include "trident/data/file_io.h"
#include "trident/data/rng.h"
#include "trident/data/sampler.h"
#include "trident/data/tokenizer.h"

namespace fs = std::filesystem;
using namespace trident;
using namespace trident::data;

namespace {
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / fmt::format("trident-data-test-{}-{}", ::getpid(), counter()++);
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::string file(const std::string& name, const std::string& content) const {
    fs::path p = path / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << content;
    return p.string();
  }
};

std::string corpus(size_t n, uint64_t seed = 7) {
  const std::string alphabet = "abcdefgh ijk\nLMNOP,.";
  std::string s;
  Rng r(seed, 0);
  for (size_t i = 0; i < n; ++i) s.push_back(alphabet[r.next_below(alphabet.size())]);
  return s;
}
}  // namespace

TEST(Tokenizer, CharVocabIsSortedUniqueCodePoints) {
  Tokenizer t = Tokenizer::char_level("hello, world\n");
  // Independent reference: Python's sorted(set(text)).
  std::set<char> ref(std::begin("hello, world\n"), std::end("hello, world\n") - 1);
  ASSERT_EQ(t.vocab_size(), static_cast<int>(ref.size()));
  int i = 0;
  for (char c : ref) EXPECT_EQ(t.code_points()[i++], static_cast<uint32_t>(c));
  auto ids = t.encode("hello");
  // ' '=0? sorted: '\n',' ',',','d','e','h','l','o','r','w'
  EXPECT_EQ(ids, (std::vector<int32_t>{5, 4, 6, 6, 7}));
  EXPECT_EQ(t.decode(ids), "hello");
}

TEST(Tokenizer, CharRoundTripsUtf8AndInvalidBytes) {
  std::string text = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 bad:\xff\xc3 end";
  Tokenizer t = Tokenizer::char_level(text);
  auto ids = t.encode(text);
  EXPECT_EQ(t.decode(ids), text);
  // é, €, 😀 are single tokens; the two invalid bytes become one token each.
  // c a f é ' ' € ' ' 😀 ' ' b a d : \xff \xc3 ' ' e n d
  EXPECT_EQ(ids.size(), 19u);
  auto j = t.to_json();
  Tokenizer back = Tokenizer::from_json(nlohmann::json::parse(j.dump()));
  EXPECT_EQ(back.fingerprint(), t.fingerprint());
  EXPECT_EQ(back.decode(back.encode(text)), text);
}

TEST(Tokenizer, ByteRoundTripAndJson) {
  std::string text("\x00\x01 abc \xff\xfe", 9);
  Tokenizer t = Tokenizer::byte_level();
  EXPECT_EQ(t.vocab_size(), 256);
  auto ids = t.encode(text);
  ASSERT_EQ(ids.size(), 9u);
  EXPECT_EQ(ids[8], 0xfe);
  EXPECT_EQ(t.decode(ids), text);
  EXPECT_EQ(Tokenizer::from_json(t.to_json()).kind(), TokenizerKind::kByte);
}

TEST(Tokenizer, Errors) {
  Tokenizer t = Tokenizer::char_level("abc");
  try {
    t.encode("abz");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'z'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(t.decode(std::vector<int32_t>{3}), InvalidArgument);
  EXPECT_THROW(parse_tokenizer_kind("bpe"), InvalidArgument);
  EXPECT_THROW(Tokenizer::from_json(nlohmann::json{{"kind", "char"}}), InvalidArgument);
}

TEST(Dataset, SplitIsNanoGptNinetyTen) {
  TempDir d;
  std::string text = corpus(1001);
  auto ds = TokenDataset::open({d.file("in.txt", text), TokenizerKind::kChar, {}, "", ""});
  ASSERT_EQ(ds.size(), 1001u);
  EXPECT_EQ(ds.train_size(), 900u);  // int(1001 * 0.9) = 900
  auto tr = ds.span(Split::kTrain), va = ds.span(Split::kVal);
  EXPECT_EQ(tr.begin, 0u);
  EXPECT_EQ(tr.size, 900u);
  EXPECT_EQ(va.begin, 900u);
  EXPECT_EQ(va.size, 101u);
  auto ref = ds.tokenizer().encode(text);
  EXPECT_EQ(va.at(0), ref[900]);
  EXPECT_EQ(ds.tokenizer().decode(&ref[0], ref.size()), text);
}

TEST(Dataset, CacheIsReusedAndRebuiltWhenTheSourceChanges) {
  TempDir d;
  std::string src = d.file("in.txt", corpus(5000));
  std::string cache = (d.path / "cache").string();
  auto a = TokenDataset::open({src, TokenizerKind::kChar, {}, cache, ""});
  EXPECT_FALSE(a.cache_hit());
  ASSERT_TRUE(fs::exists(a.cache_path()));
  EXPECT_EQ(fs::file_size(a.cache_path()) % 2, 0u);  // uint16 tokens
  auto b = TokenDataset::open({src, TokenizerKind::kChar, {}, cache, ""});
  EXPECT_TRUE(b.cache_hit());
  EXPECT_EQ(b.cache_path(), a.cache_path());
  std::vector<int32_t> xa(5000), xb(5000);
  a.copy(0, 5000, xa.data());
  b.copy(0, 5000, xb.data());
  EXPECT_EQ(xa, xb);
  EXPECT_EQ(b.tokenizer().fingerprint(), a.tokenizer().fingerprint());

  // Change one character: rebuilt, and the new tokens reflect the change.
  std::string text = corpus(5000);
  text[10] = 'Z';
  d.file("in.txt", text);
  auto c = TokenDataset::open({src, TokenizerKind::kChar, {}, cache, ""});
  EXPECT_FALSE(c.cache_hit());
  EXPECT_EQ(c.tokenizer().decode(std::vector<int32_t>{c.at(10)}), "Z");
  EXPECT_TRUE(TokenDataset::open({src, TokenizerKind::kChar, {}, cache, ""}).cache_hit());

  // Another tokenizer uses its own cache file; a corrupt cache file is rebuilt.
  auto by = TokenDataset::open({src, TokenizerKind::kByte, {}, cache, ""});
  EXPECT_NE(by.cache_path(), c.cache_path());
  EXPECT_EQ(by.at(10), 'Z');
  {
    std::fstream f(c.cache_path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  auto e = TokenDataset::open({src, TokenizerKind::kChar, {}, cache, ""});
  EXPECT_FALSE(e.cache_hit());
  std::vector<int32_t> xe(5000);
  e.copy(0, 5000, xe.data());
  EXPECT_EQ(xe, e.tokenizer().encode(text));
}

TEST(Dataset, TokenizerOverrideEncodesWithThatVocabulary) {
  TempDir d;
  std::string src = d.file("in.txt", "bca");
  Tokenizer t = Tokenizer::char_level("abcdef");
  auto ds = TokenDataset::open({src, TokenizerKind::kChar, t, (d.path / "c").string(), ""});
  EXPECT_EQ(ds.tokenizer().vocab_size(), 6);
  EXPECT_EQ(ds.at(0), 1);
  // A cached file built with the corpus vocabulary is not reused for another vocabulary.
  auto own = TokenDataset::open({src, TokenizerKind::kChar, {}, (d.path / "c").string(), ""});
  EXPECT_FALSE(own.cache_hit());
  EXPECT_EQ(own.at(0), 1);  // 'b' in {a, b, c}
  EXPECT_EQ(own.tokenizer().vocab_size(), 3);
  EXPECT_THROW(TokenDataset::open({src, TokenizerKind::kChar, Tokenizer::char_level("xyz"), "", ""}), InvalidArgument);
}

TEST(Dataset, FolderSkipsBinariesSymlinksAndPrefersU8Twins) {
  TempDir d;
  d.file("b/two", "BBB\n");
  d.file("a", "AAA\n");
  d.file("a.dat", std::string("\x00\x00\x00\x02idx", 7));
  d.file("c", "latin1 c\n");
  d.file("c.u8", "utf8 c\n");
  d.file(".hidden", "HIDDEN\n");
  fs::create_symlink(d.path / "a", d.path / "a.u8");
  auto files = list_source_files(d.path.string());
  std::vector<std::string> rel;
  for (auto& f : files) rel.push_back(fs::relative(f, d.path).string());
  EXPECT_EQ(rel, (std::vector<std::string>{"a", "b/two", "c.u8"}));
  auto ds = TokenDataset::open({d.path.string(), TokenizerKind::kByte, {}, "", ""});
  std::vector<int32_t> all(ds.size());
  ds.copy(0, all.size(), all.data());
  EXPECT_EQ(ds.tokenizer().decode(all), "AAA\nBBB\nutf8 c\n");
  EXPECT_THROW(list_source_files((d.path / "missing").string()), InvalidArgument);
}

TEST(Dataset, DebianFortunesFolder) {
  const std::string dir = "/usr/share/games/fortunes";
  if (!fs::is_directory(dir)) TRIDENT_SKIP_MISSING(dir + " not found (apt-get install fortunes)");
  auto files = list_source_files(dir);
  ASSERT_FALSE(files.empty());
  for (auto& f : files) {
    EXPECT_FALSE(f.ends_with(".dat")) << f;
    EXPECT_FALSE(fs::is_symlink(f)) << f;
  }
}

TEST(Sampler, RandomWindowsAreNanoGptShapedAndDeterministic) {
  TempDir d;
  auto ds = TokenDataset::open({d.file("in.txt", corpus(3000)), TokenizerKind::kByte, {}, "", ""});
  auto tr = ds.span(Split::kTrain);
  const int T = 16, B = 8;
  RandomWindowSampler s(tr, T, 1337), s2(tr, T, 1337), other(tr, T, 1338);
  std::vector<int32_t> x(B * T), y(B * T), x2(B * T), y2(B * T);
  s.sample_batch(5, 0, B, 0, B, x.data(), y.data());
  s2.sample_batch(5, 0, B, 0, B, x2.data(), y2.data());
  EXPECT_EQ(x, x2);
  EXPECT_EQ(y, y2);
  other.sample_batch(5, 0, B, 0, B, x2.data(), y2.data());
  EXPECT_NE(x, x2);
  for (int b = 0; b < B; ++b) {
    size_t i = s.window_start(5, 0, b);
    ASSERT_LT(i, tr.size - T);
    for (int t = 0; t < T; ++t) {
      EXPECT_EQ(x[b * T + t], tr.at(i + t));
      EXPECT_EQ(y[b * T + t], tr.at(i + t + 1));
    }
  }
  // Offsets cover the whole range [0, len - T) over many draws.
  size_t lo = SIZE_MAX, hi = 0;
  for (int k = 0; k < 20000; ++k) {
    size_t i = s.window_start(k, 0, 0);
    lo = std::min(lo, i);
    hi = std::max(hi, i);
  }
  EXPECT_EQ(lo, 0u);
  EXPECT_EQ(hi, tr.size - T - 1);
}

TEST(Sampler, RankShardsUnionToTheOneRankBatch) {
  TempDir d;
  auto ds = TokenDataset::open({d.file("in.txt", corpus(4000)), TokenizerKind::kByte, {}, "", ""});
  const int T = 8, per_rank = 3;
  for (int world : {1, 2, 3, 4}) {
    const int G = per_rank * world;
    for (auto kind : {SamplerKind::kRandom, SamplerKind::kEpoch}) {
      TrainSampler one(kind, ds.span(Split::kTrain), T, 42, 2, G);
      for (int64_t step = 0; step < 30; ++step) {
        for (int micro = 0; micro < 2; ++micro) {
          std::vector<int32_t> x(G * T), y(G * T);
          one.sample(step, micro, 0, G, x.data(), y.data());
          std::vector<int32_t> xs, ys;
          for (int r = 0; r < world; ++r) {
            TrainSampler rank(kind, ds.span(Split::kTrain), T, 42, 2, G);
            std::vector<int32_t> xr(per_rank * T), yr(per_rank * T);
            rank.sample(step, micro, r * per_rank, per_rank, xr.data(), yr.data());
            xs.insert(xs.end(), xr.begin(), xr.end());
            ys.insert(ys.end(), yr.begin(), yr.end());
          }
          ASSERT_EQ(xs, x) << "world " << world << " step " << step;
          ASSERT_EQ(ys, y);
        }
      }
    }
  }
}

TEST(Sampler, EpochVisitsEveryWindowOncePerEpoch) {
  TempDir d;
  auto ds = TokenDataset::open({d.file("in.txt", corpus(1000)), TokenizerKind::kByte, {}, "", ""});
  auto tr = ds.span(Split::kTrain);  // 900 tokens
  const int T = 10;
  EpochSampler s(tr, T, 3);
  EXPECT_EQ(s.num_windows(), 89);  // (900 - 1) / 10
  std::vector<size_t> e0, e1;
  s.set_epoch(0);
  for (int k = 0; k < s.num_windows(); ++k) e0.push_back(s.window_start(k));
  s.set_epoch(1);
  for (int k = 0; k < s.num_windows(); ++k) e1.push_back(s.window_start(k));
  EXPECT_NE(e0, e1);
  std::vector<size_t> want;
  for (int w = 0; w < 89; ++w) want.push_back(static_cast<size_t>(w) * T);
  std::sort(e0.begin(), e0.end());
  std::sort(e1.begin(), e1.end());
  EXPECT_EQ(e0, want);
  EXPECT_EQ(e1, want);
  EpochSampler again(tr, T, 3);
  again.set_epoch(1);
  EXPECT_EQ(again.window_start(5), s.window_start(5));
  std::vector<int32_t> x(T), y(T);
  s.sample_batch(0, 4, 2, 1, x.data(), y.data());
  size_t st = s.window_start(2);
  EXPECT_EQ(x[0], tr.at(st));
  EXPECT_EQ(y[T - 1], tr.at(st + T));
}

TEST(Rng, StateRoundTripsAndResumesExactly) {
  Rng a(99, 5);
  for (int i = 0; i < 17; ++i) a.next_u64();
  Rng b;
  b.load_state(nlohmann::json::parse(a.state().dump()));
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.next_u64(), b.next_u64());
  // Moments of the uniform draws (independent reference: U(0,1) has mean 1/2, variance 1/12).
  Rng c(1, 1);
  double s = 0, s2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    double u = c.next_double();
    s += u;
    s2 += u * u;
  }
  EXPECT_NEAR(s / n, 0.5, 0.005);
  EXPECT_NEAR(s2 / n - (s / n) * (s / n), 1.0 / 12, 0.002);
}

TEST(FileIo, AtomicWriteKeepsOldFileOnInjectedFailure) {
  TempDir d;
  std::string p = (d.path / "f.bin").string();
  io::atomic_write_file(p, [](io::FileWriter& w) { w.write("old contents"); });
  io::testing::set_write_fault(4, ENOSPC);
  try {
    io::atomic_write_file(p, [](io::FileWriter& w) { w.write("new contents that do not fit"); }, "the old one is intact");
    FAIL() << "expected an error";
  } catch (const IoError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("no space left"), std::string::npos) << m;
    EXPECT_NE(m.find("the old one is intact"), std::string::npos) << m;
  }
  EXPECT_EQ(io::read_file(p), "old contents");
  int n = 0;
  for (auto& e : fs::directory_iterator(d.path)) n += e.is_regular_file();
  EXPECT_EQ(n, 1);  // no temporary left behind
  io::testing::set_rename_fault(EIO);
  EXPECT_THROW(io::atomic_write_file(p, [](io::FileWriter& w) { w.write("x"); }), IoError);
  EXPECT_EQ(io::read_file(p), "old contents");
  uint64_t h = io::atomic_write_file(p, [](io::FileWriter& w) { w.write("new"); });
  EXPECT_EQ(io::read_file(p), "new");
  EXPECT_EQ(h, io::fnv1a64("new"));
  EXPECT_EQ(io::file_fnv1a64(p), h);
  // FNV-1a 64 reference values (from the published test vectors).
  EXPECT_EQ(io::fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(io::fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(io::fnv1a64("foobar"), 0x85944171f73967e8ull);
}
