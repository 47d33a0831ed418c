// Llama 3's tokenizer against its reference (the npm package llama3-tokenizer-js run with node): the
// vocabulary is dumped from the package at test time as both a Hugging Face tokenizer.json and a tiktoken
// tokenizer.model (nothing derived from it is committed), both load to the same tokenizer, and the ids of
// an authored torture text, GPT-2's torture text and tiny shakespeare equal the reference's. Then what the
// reference cannot judge: the merge order on a tiny vocabulary, tiktoken's \s, special spellings, any
// bytes, and refusals of files that are not Llama 3's.
// Without node or the package the reference tests skip, except under CI=true, where they fail.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "harness/shared_data.h"
#include "harness/temp_dir.h"

#include "harness/token_ids.h"
#include "trident/core/error.h"
#include "trident/data/file_io.h"
#include "trident/data/llama3_bpe.h"
#include "trident/data/rng.h"
#include "trident/data/tokenizer.h"

namespace fs = std::filesystem;
using namespace trident;
using trident::testing::first_difference;
using namespace trident::data;

namespace {
const std::string kScript = std::string(TRIDENT_SOURCE_DIR) + "/tests/unit/data/llama3_reference.js";

std::string expect_invalid(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InvalidArgument";
  return {};
}

// The reference's files, dumped once per test binary run; the tokenizers loaded once.
class Llama3Reference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / fmt::format("trident-llama3-ref-{}", ::getpid());
    fs::remove_all(dir_);
    const std::string cmd = "node " + kScript + " dump '" + dir_.string() + "' > /dev/null 2>&1";
    ok_ = std::system(cmd.c_str()) == 0 && fs::exists(dir_ / "tokenizer.model") && fs::exists(dir_ / "tokenizer.json");
    if (!ok_) return;
    from_model_ = new Tokenizer(Tokenizer::llama3((dir_ / "tokenizer.model").string()));
    from_json_ = new Tokenizer(Tokenizer::llama3((dir_ / "tokenizer.json").string()));
  }
  static void TearDownTestSuite() {
    delete from_model_;
    delete from_json_;
    from_model_ = from_json_ = nullptr;
    fs::remove_all(dir_);
  }
  void SetUp() override {
    if (!ok_) TRIDENT_SKIP_MISSING("node or the npm package llama3-tokenizer-js is missing (scripts/deps.sh build)");
  }
  static std::vector<int32_t> reference_ids(const std::string& text_file) {
    fs::path out = dir_ / "ids.json";
    std::string cmd = "node " + kScript + " encode '" + text_file + "' '" + out.string() + "'";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return nlohmann::json::parse(io::read_file(out.string())).get<std::vector<int32_t>>();
  }
  // Both tokenizers against the reference on `file`.
  static void expect_reference(const std::string& file) {
    auto want = reference_ids(file);
    std::string text = io::read_file(file);
    for (const Tokenizer* t : {from_model_, from_json_}) {
      auto got = t->encode(text, 1);
      EXPECT_TRUE(got == want) << file << ": " << first_difference(got, want);
      EXPECT_EQ(t->decode(got), text);
    }
  }

  static inline fs::path dir_;
  static inline bool ok_ = false;
  static inline Tokenizer* from_model_ = nullptr;
  static inline Tokenizer* from_json_ = nullptr;
};

// A tiny byte-level vocabulary: the 256 bytes at ranks 0..255, then `extra` tokens.
std::string base64(const std::string& s) {
  static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < s.size(); i += 3) {
    uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8) | uint8_t(s[i + 2]);
    for (int k = 18; k >= 0; k -= 6) out += a[(v >> k) & 63];
  }
  if (i + 1 == s.size()) {
    uint32_t v = uint8_t(s[i]) << 16;
    out += a[(v >> 18) & 63], out += a[(v >> 12) & 63], out += "==";
  } else if (i + 2 == s.size()) {
    uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8);
    out += a[(v >> 18) & 63], out += a[(v >> 12) & 63], out += a[(v >> 6) & 63], out += "=";
  }
  return out;
}
std::string tiny_tiktoken(const std::vector<std::string>& extra) {
  std::string f;
  for (int b = 0; b < 256; ++b) f += base64(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
  for (size_t i = 0; i < extra.size(); ++i) f += base64(extra[i]) + " " + std::to_string(256 + i) + "\n";
  return f;
}
// GPT-2's byte alphabet spelling of ASCII letters is the letters themselves; " " is "Ġ".
nlohmann::json tiny_tokenizer_json(const std::vector<std::string>& extra, const std::vector<std::string>& merges) {
  nlohmann::json vocab = nlohmann::json::object();
  int n = 0;
  uint32_t shifted = 256;  // GPT-2's stand-ins for the bytes that are not printable
  for (int b = 0; b < 256; ++b) {
    const bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    uint32_t cp = direct ? static_cast<uint32_t>(b) : shifted++;
    std::string s;
    append_utf8(cp, s);
    vocab[s] = n++;
  }
  for (const auto& e : extra) vocab[e] = n++;
  nlohmann::json j;
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"ignore_merges", true}};
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", Llama3Bpe::kHfPattern}}}},
                          {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  j["added_tokens"] = {{{"id", n}, {"content", "<|begin_of_text|>"}, {"special", true}},
                       {{"id", n + 1}, {"content", "<|end_of_text|>"}, {"special", true}}};
  return j;
}

TEST_F(Llama3Reference, BothFilesLoadTheSameVocabulary) {
  for (const Tokenizer* t : {from_model_, from_json_}) {
    EXPECT_EQ(t->kind(), TokenizerKind::kLlama3);
    EXPECT_EQ(t->vocab_size(), 128256);
    EXPECT_EQ(t->end_of_text(), 128001);
    EXPECT_EQ(t->document_separator(), 128000);
    EXPECT_EQ(t->decode(std::vector<int32_t>{128000}), "<|begin_of_text|>");
    EXPECT_EQ(t->decode(std::vector<int32_t>{128009}), "<|eot_id|>");
    EXPECT_EQ(t->decode(std::vector<int32_t>{128255}), "<|reserved_special_token_247|>");
    EXPECT_THROW(t->decode(std::vector<int32_t>{128256}), InvalidArgument);
    EXPECT_THROW(t->decode(std::vector<int32_t>{-1}), InvalidArgument);
    // Llama 3's ids for "Hello" "," " world" "!".
    EXPECT_EQ(t->encode("Hello, world!"), (std::vector<int32_t>{9906, 11, 1917, 0}));
  }
  for (int32_t id = 0; id < 128256; ++id) {
    const int32_t one[1] = {id};
    ASSERT_EQ(from_model_->decode(one, 1), from_json_->decode(one, 1)) << "id " << id;
  }
  EXPECT_NE(from_model_->fingerprint(), from_json_->fingerprint());  // different files
}

TEST_F(Llama3Reference, TortureTextMatchesReference) {
  expect_reference(std::string(TRIDENT_SOURCE_DIR) + "/tests/unit/data/llama3_torture.txt");
  expect_reference(std::string(TRIDENT_SOURCE_DIR) + "/tests/unit/data/gpt2_torture.txt");
  // Single cases, each encoded alone (the start and end of text next to the piece).
  const std::vector<std::string> cases = {"1234567", "  leading", "trailing  ", "\n", "\n\n \n", "a\r\n\r\nb",
                                          "'S'LL", " 's", "?!\n\n", "\u4f60\u597d", "\U0001F600\U0001F600",
                                          " \t \t x", "x \t \t", "12345 678", "", " ", "don't"};
  fs::path in = dir_ / "cases.json", out = dir_ / "cases-ids.json";
  std::ofstream(in) << nlohmann::json(cases).dump();
  std::string cmd = "node " + kScript + " encode-each '" + in.string() + "' '" + out.string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto want = nlohmann::json::parse(io::read_file(out.string())).get<std::vector<std::vector<int32_t>>>();
  ASSERT_EQ(want.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(from_model_->encode(cases[i]), want[i]) << nlohmann::json(cases[i]).dump();
    EXPECT_EQ(from_json_->encode(cases[i]), want[i]) << nlohmann::json(cases[i]).dump();
  }
}

TEST_F(Llama3Reference, TinyShakespeareMatchesReferenceAndParallelEqualsSerial) {
  const std::string input = trident::testing::shared_data_dir() + "/tinyshakespeare/input.txt";
  if (!fs::exists(input)) TRIDENT_SKIP_MISSING("no " + input);
  expect_reference(input);
  std::string text = io::read_file(input), big;
  for (int i = 0; i < 6; ++i) big += text;
  auto serial = from_model_->encode(big, 1), parallel = from_model_->encode(big, 4);
  EXPECT_TRUE(serial == parallel) << first_difference(serial, parallel);
}

TEST_F(Llama3Reference, SpecialSpellingsEncodeAsTextAndAnyBytesRoundTrip) {
  const std::string s = "<|begin_of_text|>Hi<|end_of_text|><|eot_id|>";
  for (const Tokenizer* t : {from_model_, from_json_}) {
    auto ids = t->encode(s);
    for (int32_t id : ids) EXPECT_LT(id, 128000) << "a special token from text";
    EXPECT_EQ(t->decode(ids), s);
  }
  Rng r(5, 0);
  for (int k = 0; k < 40; ++k) {
    std::string b(static_cast<size_t>(r.next_below(300)), '\0');
    for (auto& ch : b) ch = static_cast<char>(r.next_below(256));
    EXPECT_EQ(from_model_->decode(from_model_->encode(b)), b);
  }
  for (std::string b : {std::string("\xff\xfe", 2), std::string("caf\xc3", 4), std::string("a\0b", 3)})
    EXPECT_EQ(from_json_->decode(from_json_->encode(b)), b);
}

TEST_F(Llama3Reference, JsonRecordsFileAndChecksumAndAFolderFindsItsFile) {
  auto j = from_json_->to_json();
  EXPECT_EQ(j["kind"], "llama3");
  EXPECT_EQ(j["model"], (dir_ / "tokenizer.json").string());
  Tokenizer back = Tokenizer::from_json(j);
  EXPECT_EQ(back.fingerprint(), from_json_->fingerprint());
  j["fnv1a64"] = "0000000000000000";
  EXPECT_THROW(Tokenizer::from_json(j), InvalidArgument);
  // A folder: tokenizer.json first.
  EXPECT_EQ(Tokenizer::llama3(dir_.string()).to_json()["model"], (dir_ / "tokenizer.json").string());
}

// tiktoken merges one pair at a time, lowest rank first: on "abab" with ranks "aba" = 256 < "ab" = 257,
// merging "ab" creates ("ab", "a") of lower rank, which goes before the second "ab": [aba, b], not [ab, ab].
// A piece that is a token maps to it even where no merges lead there ("xyz": neither "xy" nor "yz" is one).
TEST(Llama3Bpe, MergesOnePairAtATimeLowestRankFirst) {
  trident::testing::TempDir d("llama3-tiny");
  const std::vector<std::string> extra = {"aba", "ab", "ba", "bab", "xyz"};
  std::ofstream(d.path / "tokenizer.model", std::ios::binary) << tiny_tiktoken(extra);
  Tokenizer tm = Tokenizer::llama3((d.path / "tokenizer.model").string());
  EXPECT_EQ(tm.vocab_size(), 261 + 256);
  EXPECT_EQ(tm.end_of_text(), 262);  // 261 regular tokens, then Llama 3's 256 special tokens
  EXPECT_EQ(tm.document_separator(), 261);
  EXPECT_EQ(tm.encode("abab"), (std::vector<int32_t>{256, 'b'}));
  EXPECT_EQ(tm.encode("bab"), (std::vector<int32_t>{259}));
  EXPECT_EQ(tm.encode("xyz xyzw"), (std::vector<int32_t>{260, ' ', 'x', 'y', 'z', 'w'}));
  // The same vocabulary as tokenizer.json with explicit merges in tiktoken's order agrees.
  auto j = tiny_tokenizer_json(extra, {"ab a", "a b", "b a", "b ab", "ba b"});
  std::ofstream(d.path / "tokenizer.json") << j.dump();
  Tokenizer tj = Tokenizer::llama3((d.path / "tokenizer.json").string());
  EXPECT_EQ(tj.vocab_size(), 263);
  for (std::string s : {"abab", "ababab", "babab", "aab", "abba", "bab", "xyz xyzw"})
    EXPECT_EQ(tj.encode(s), tm.encode(s)) << s;
}

// \s is tiktoken's (Unicode White_Space): U+0085 is space, U+FEFF is not (JavaScript's \s is the reverse).
TEST(Llama3Bpe, WhitespaceIsTiktokens) {
  trident::testing::TempDir d("llama3-ws");
  std::ofstream(d.path / "tokenizer.model", std::ios::binary) << tiny_tiktoken({});
  auto bpe = Llama3Bpe::load((d.path / "tokenizer.model").string());
  using V = std::vector<std::string_view>;
  EXPECT_EQ(bpe->split("\u0085!"), (V{"\u0085", "!"}));
  EXPECT_EQ(bpe->split("\ufeff!"), (V{"\ufeff!"}));
  EXPECT_EQ(bpe->split("a \u3000\u00a0\nb"), (V{"a", " \u3000\u00a0\n", "b"}));
  EXPECT_EQ(bpe->split("I'M 1234567"), (V{"I", "'M", " ", "123", "456", "7"}));
  EXPECT_EQ(bpe->split("end.\n\nNext"), (V{"end", ".\n\n", "Next"}));
}

TEST(Llama3Bpe, RefusesFilesThatAreNotLlama3sWithTheReason) {
  trident::testing::TempDir d("llama3-bad");
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(d.path / name, std::ios::binary) << text;
    return (d.path / name).string();
  };
  auto has = [](const std::string& msg, const std::string& part) {
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
  };
  has(expect_invalid([] { Tokenizer::llama3(""); }), "--tokenizer_model");
  has(expect_invalid([&] { Tokenizer::llama3(d.path.string()); }), "holds no tokenizer file");
  // A SentencePiece model (binary protobuf) or any other text.
  std::string p = write("sp.model", std::string("\x0a\x0b\x0a\x05<unk>\x15\x00\x00\x00\x00", 14));
  has(expect_invalid([&] { Tokenizer::llama3(p); }), "is not \"BASE64_TOKEN RANK\"");
  has(expect_invalid([&] { Tokenizer::llama3(p); }), "--tokenizer sentencepiece");
  std::string tk = tiny_tiktoken({});
  p = write("gap.model", tk + base64("xy") + " 257\n");
  has(expect_invalid([&] { Tokenizer::llama3(p); }), "no token of rank 256");
  p = write("twice.model", tk + base64("xy") + " 255\n");
  has(expect_invalid([&] { Tokenizer::llama3(p); }), "rank 255 appears twice");
  p = write("nobyte.model", tk.substr(tk.find('\n') + 1) + base64("xy") + " 0\n");
  has(expect_invalid([&] { Tokenizer::llama3(p); }), "no token for byte 0");
  // tokenizer.json: another model's pre-tokenizer, a normalizer, a SentencePiece-style vocabulary.
  auto j = tiny_tokenizer_json({}, {});
  auto gpt2 = j;
  gpt2["pre_tokenizer"] = {{"type", "ByteLevel"}, {"use_regex", true}};
  p = write("gpt2.json", gpt2.dump());
  has(expect_invalid([&] { Tokenizer::llama3(p); }), "not Llama 3's pattern");
  auto norm = j;
  norm["normalizer"] = {{"type", "NFC"}};
  p = write("norm.json", norm.dump());
  has(expect_invalid([&] { Tokenizer::llama3(p); }), "has a normalizer (NFC)");
  auto sp = j;
  sp["model"]["vocab"]["\u2581the"] = 256;
  p = write("sp.json", sp.dump());
  has(expect_invalid([&] { Tokenizer::llama3(p); }), "outside the byte-level alphabet");
  auto wp = j;
  wp["model"]["type"] = "WordPiece";
  p = write("wp.json", wp.dump());
  has(expect_invalid([&] { Tokenizer::llama3(p); }), "holds a WordPiece model");
  auto merge = j;
  merge["model"]["merges"] = {"a zz"};
  p = write("merge.json", merge.dump());
  has(expect_invalid([&] { Tokenizer::llama3(p); }), "merge 'a zz' names a token missing");
  p = write("trunc.json", j.dump().substr(0, 100));
  has(expect_invalid([&] { Tokenizer::llama3(p); }), "is not valid JSON");
  // The good tiny file loads, through its folder too.
  write("tokenizer.json", j.dump());
  EXPECT_EQ(Tokenizer::llama3(d.path.string()).vocab_size(), 258);
}

}  // namespace
