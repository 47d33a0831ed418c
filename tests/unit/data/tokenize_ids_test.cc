// `trident tokenize --ids`: the CLI prints, for every tokenizer trident has, exactly the ids the library's
// encode gives (no BOS/EOS, no document separator), on one line; and its refusals name the fix.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "harness/shared_data.h"
#include "harness/temp_dir.h"
#include "trident/data/file_io.h"
#include "trident/data/sentencepiece_model.h"
#include "trident/data/tokenizer.h"

using namespace trident;
using namespace trident::data;
namespace fs = std::filesystem;

namespace {
struct CliResult {
  int rc;
  std::string out, err;
};
CliResult trident_cli(const std::string& args, const fs::path& dir) {
  const std::string err_file = (dir / "stderr.txt").string();
  const std::string cmd = std::string(TRIDENT_BIN) + " " + args + " 2>" + err_file;
  std::FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, io::read_file(err_file)};
}
std::string line_of(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
  return s + "\n";
}
// A tiny Llama 3 style tiktoken file: the 256 bytes, then "he", "ll", "hell", "hello".
std::string tiny_tiktoken() {
  static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  auto b64 = [&](const std::string& s) {
    std::string out;
    uint32_t acc = 0;
    int bits = 0;
    for (unsigned char c : s) {
      acc = (acc << 8) | c, bits += 8;
      while (bits >= 6) out += a[(acc >> (bits -= 6)) & 63];
    }
    if (bits > 0) out += a[(acc << (6 - bits)) & 63];
    while (out.size() % 4) out += '=';
    return out;
  };
  std::string f;
  int rank = 0;
  for (int b = 0; b < 256; ++b) f += b64(std::string(1, static_cast<char>(b))) + " " + std::to_string(rank++) + "\n";
  for (const char* t : {"he", "ll", "hell", "hello"}) f += b64(t) + " " + std::to_string(rank++) + "\n";
  return f;
}
}  // namespace

TEST(TokenizeIds, EveryTokenizerPrintsTheLibrarysIds) {
  ASSERT_TRUE(fs::exists(TRIDENT_BIN)) << "build the trident target first: " << TRIDENT_BIN;
  trident::testing::TempDir d("tokenize-ids");
  const std::string text = "hello world, hello\n\nnaïve café 12345 日本語 hell\tbent\n";
  const fs::path file = d.path / "text.txt";
  std::ofstream(file, std::ios::binary) << text;
  const std::string data = " --data " + file.string();

  CliResult r = trident_cli("tokenize --ids --tokenizer byte" + data, d.path);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, line_of(Tokenizer::byte_level().encode(text)));

  r = trident_cli("tokenize --ids --tokenizer char" + data, d.path);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, line_of(Tokenizer::char_level(text).encode(text)));

  std::ofstream(d.path / "tokenizer.model", std::ios::binary) << tiny_tiktoken();
  const Tokenizer llama = Tokenizer::llama3((d.path / "tokenizer.model").string());
  r = trident_cli("tokenize --ids --tokenizer llama3 --tokenizer_model " + (d.path / "tokenizer.model").string() + data,
                  d.path);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, line_of(llama.encode(text)));
  EXPECT_NE(r.out.find("259 "), std::string::npos) << "\"hello\" is one token: " << r.out;
  // llama3 also takes the folder through --tokenizer_dir.
  r = trident_cli("tokenize --ids --tokenizer llama3 --tokenizer_dir " + d.path.string() + data, d.path);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, line_of(llama.encode(text)));

  const std::string gpt2 = trident::testing::gpt2_bpe_dir();
  if (!gpt2.empty()) {
    r = trident_cli("tokenize --ids --tokenizer gpt2 --tokenizer_dir " + gpt2 + data, d.path);
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(r.out, line_of(Tokenizer::gpt2(gpt2).encode(text)));
  }

  std::string corpus;
  for (int i = 0; i < 400; ++i) corpus += text + "line " + std::to_string(i) + "\n";
  std::ofstream(d.path / "corpus.txt") << corpus;
  SentencePieceTrainOptions o;
  o.inputs = {(d.path / "corpus.txt").string()};
  o.model_prefix = (d.path / "sp").string();
  o.vocab_size = 320;  // byte fallback takes 256 of them; this corpus allows at most 345
  o.threads = 1;
  const std::string model = train_sentencepiece(o);
  r = trident_cli("tokenize --ids --tokenizer sentencepiece --tokenizer_model " + model + data, d.path);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, line_of(Tokenizer::sentencepiece(model).encode(text)));
}

TEST(TokenizeIds, RefusalsNameTheFix) {
  ASSERT_TRUE(fs::exists(TRIDENT_BIN)) << "build the trident target first: " << TRIDENT_BIN;
  trident::testing::TempDir d("tokenize-refuse");
  std::ofstream(d.path / "t.txt") << "some text\n";
  const std::string data = " --data " + (d.path / "t.txt").string();
  CliResult r = trident_cli("tokenize --tokenizer byte" + data, d.path);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--out FOLDER is required"), std::string::npos) << r.err;
  r = trident_cli("tokenize --tokenizer char --out " + (d.path / "o").string() + data, d.path);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("char tokenizer is defined by its corpus"), std::string::npos) << r.err;
  r = trident_cli("tokenize --ids --tokenizer llama3" + data, d.path);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--tokenizer_model"), std::string::npos) << r.err;
  r = trident_cli("tokenize --tokenizer byte --shard_version 2 --json --val_fraction 0 --out " +
                      (d.path / "o").string() + data,
                  d.path);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("\"shard_version\":2"), std::string::npos) << r.out;
}
