#include "trident/data/sentencepiece_model.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>

#include "trident/core/error.h"
#include "trident/data/file_io.h"

namespace trident::data {

SentencePieceModel::~SentencePieceModel() = default;

std::shared_ptr<const SentencePieceModel> SentencePieceModel::load(const std::string& model_path) {
  if (model_path.empty()) {
    TRIDENT_THROW(InvalidArgument, "sentencepiece tokenizer: give the model file with --tokenizer_model FILE.model "
                                   "(train one with `trident tokenize --train-sentencepiece`)");
  }
  std::shared_ptr<SentencePieceModel> m(new SentencePieceModel());
  std::string bytes = io::read_file(model_path);
  m->path_ = model_path;
  m->fingerprint_ = io::fnv1a64(bytes);
  m->sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  auto st = m->sp_->LoadFromSerializedProto(bytes);
  if (!st.ok()) {
    TRIDENT_THROW(InvalidArgument, "sentencepiece tokenizer: '{}' is not a SentencePiece model: {}", model_path,
                  st.ToString());
  }
  return m;
}

int SentencePieceModel::vocab_size() const { return sp_->GetPieceSize(); }
int SentencePieceModel::eos_id() const { return sp_->eos_id(); }

std::vector<int32_t> SentencePieceModel::encode(std::string_view text, int threads) const {
  constexpr size_t kMinChunk = 1 << 20;
  if (threads <= 0) threads = text.size() >= 4 * kMinChunk ? static_cast<int>(std::thread::hardware_concurrency()) : 1;
  std::vector<size_t> cuts{0};
  if (threads > 1) {
    size_t target = std::max(kMinChunk, text.size() / (static_cast<size_t>(threads) * 4));
    for (size_t p = target; p < text.size();) {
      size_t nl = text.find('\n', p);
      if (nl == std::string_view::npos || nl + 1 >= text.size()) break;
      cuts.push_back(nl + 1);
      p = nl + 1 + target;
    }
  }
  cuts.push_back(text.size());
  const size_t chunks = cuts.size() - 1;
  std::vector<std::vector<int>> parts(chunks);
  std::vector<std::string> errors(chunks);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t c; (c = next.fetch_add(1)) < chunks;) {
      auto st = sp_->Encode(text.substr(cuts[c], cuts[c + 1] - cuts[c]), &parts[c]);
      if (!st.ok()) errors[c] = st.ToString();
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < std::min<int>(threads, static_cast<int>(chunks)); ++w) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  for (auto& e : errors)
    if (!e.empty()) TRIDENT_THROW(InvalidArgument, "sentencepiece encode failed: {}", e);
  std::vector<int32_t> out;
  for (auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::string SentencePieceModel::decode(const int32_t* ids, size_t n) const {
  std::vector<int> v(ids, ids + n);
  for (int id : v) {
    if (id < 0 || id >= vocab_size()) {
      TRIDENT_THROW(InvalidArgument, "token id {} is outside the sentencepiece vocabulary [0, {})", id, vocab_size());
    }
  }
  std::string out;
  auto st = sp_->Decode(v, &out);
  if (!st.ok()) TRIDENT_THROW(InvalidArgument, "sentencepiece decode failed: {}", st.ToString());
  return out;
}

std::string train_sentencepiece(const SentencePieceTrainOptions& o) {
  if (o.model_type != "bpe" && o.model_type != "unigram") {
    TRIDENT_THROW(InvalidArgument, "--model_type '{}': use bpe or unigram", o.model_type);
  }
  if (o.inputs.empty()) TRIDENT_THROW(InvalidArgument, "train sentencepiece: no input files");
  std::string inputs;
  for (const auto& f : o.inputs) inputs += (inputs.empty() ? "" : ",") + f;
  int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::unordered_map<std::string, std::string> kw{
      {"input", inputs},
      {"model_prefix", o.model_prefix},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"model_type", o.model_type},
      {"character_coverage", "1.0"},
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      {"add_dummy_prefix", "false"},
      {"remove_extra_whitespaces", "false"},
      {"normalization_rule_name", "identity"},
      {"allow_whitespace_only_pieces", "true"},
      {"max_sentence_length", "16384"},
      {"num_threads", std::to_string(threads)},
      {"minloglevel", "1"},
  };
  if (o.max_sentences > 0) {
    kw["input_sentence_size"] = std::to_string(o.max_sentences);
    kw["shuffle_input_sentence"] = "true";
  }
  auto st = sentencepiece::SentencePieceTrainer::Train(kw);
  if (!st.ok()) TRIDENT_THROW(InvalidArgument, "sentencepiece training failed: {}", st.ToString());
  return o.model_prefix + ".model";
}

}  // namespace trident::data
