// SentencePiece tokenizers through Debian's libsentencepiece: load a .model file, encode/decode, and
// train one on a corpus (BPE or unigram).
//
// Models trident trains use the identity normalization, no dummy prefix, byte fallback and split digits,
// so any valid UTF-8 round-trips (characters outside the vocabulary become <0xNN> byte pieces) and "\n"
// survives; SentencePiece itself replaces bytes that are not valid UTF-8 with U+FFFD.
// A model trained elsewhere keeps its own normalization: decode(encode(s)) may then differ from s.
// Long inputs are encoded per chunk of lines on several threads; the chunks are cut after a "\n".
//
// Ownership: immutable after load (shared through a shared_ptr). Blocking: load and train do file I/O;
// train runs for as long as the corpus needs. Thread-safety: const methods are safe concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace trident::data {

class SentencePieceModel {
 public:
  // Throws IoError / InvalidArgument naming the file.
  static std::shared_ptr<const SentencePieceModel> load(const std::string& model_path);
  ~SentencePieceModel();

  int vocab_size() const;
  int eos_id() const;  // -1 when the model has none
  uint64_t fingerprint() const { return fingerprint_; }  // FNV-1a 64 of the .model file
  const std::string& path() const { return path_; }

  std::vector<int32_t> encode(std::string_view text, int threads = 0) const;
  std::string decode(const int32_t* ids, size_t n) const;

 private:
  SentencePieceModel() = default;
  std::string path_;
  uint64_t fingerprint_ = 0;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

struct SentencePieceTrainOptions {
  std::vector<std::string> inputs;  // text files (one sentence per line)
  std::string model_prefix;         // writes <prefix>.model and <prefix>.vocab
  int vocab_size = 8000;
  std::string model_type = "bpe";   // bpe | unigram
  int threads = 0;                  // 0: hardware concurrency
  int64_t max_sentences = 2000000;  // input_sentence_size: lines sampled for training (0: all)
};
// Trains a model; returns the .model path. Throws InvalidArgument with SentencePiece's message.
std::string train_sentencepiece(const SentencePieceTrainOptions& opts);

}  // namespace trident::data
