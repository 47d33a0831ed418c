#include "trident/data/llama3_bpe.h"

#include <charconv>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_map>

#include "trident/core/error.h"
#include "trident/data/file_io.h"

namespace trident::data {
namespace fs = std::filesystem;

namespace {
constexpr const char* kWhich =
    "give Llama 3's tokenizer.model (tiktoken) or tokenizer.json (Hugging Face), or the model folder holding "
    "one, with --tokenizer_model";

// Standard base64 with optional '=' padding; false on any other character.
bool base64_decode(std::string_view s, std::string& out) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  while (!s.empty() && s.back() == '=') s.remove_suffix(1);
  if (s.size() % 4 == 1) return false;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    int v = val(c);
    if (v < 0) return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return true;
}

// tiktoken's tokenizer.model: "BASE64 RANK" per line.
ByteBpeVocab read_tiktoken(const std::string& path, const std::string& text) {
  ByteBpeVocab v;
  std::vector<bool> seen;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    size_t sp = line.find(' ');
    std::string bytes;
    int64_t rank = -1;
    bool ok = sp != std::string_view::npos && base64_decode(line.substr(0, sp), bytes) && !bytes.empty();
    if (ok) {
      auto num = line.substr(sp + 1);
      auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), rank);
      ok = ec == std::errc() && p == num.data() + num.size() && rank >= 0 && rank < (int64_t{1} << 30);
    }
    if (!ok) {
      TRIDENT_THROW(InvalidArgument,
                    "llama3 tokenizer: '{}' line {} is not \"BASE64_TOKEN RANK\", so the file is neither "
                    "tiktoken's tokenizer.model nor a tokenizer.json; a SentencePiece .model (Llama 1 and 2) goes "
                    "with --tokenizer sentencepiece",
                    path, line_no);
    }
    const auto r = static_cast<size_t>(rank);
    if (r >= v.token_bytes.size()) v.token_bytes.resize(r + 1), seen.resize(r + 1, false);
    if (seen[r])
      TRIDENT_THROW(InvalidArgument, "llama3 tokenizer: '{}' line {}: rank {} appears twice", path, line_no, r);
    seen[r] = true;
    v.token_bytes[r] = std::move(bytes);
  }
  for (size_t r = 0; r < seen.size(); ++r) {
    if (!seen[r]) {
      TRIDENT_THROW(InvalidArgument, "llama3 tokenizer: '{}' has no token of rank {} (ranks must be 0..{})", path, r,
                    seen.size() - 1);
    }
  }
  const auto n = static_cast<int32_t>(v.token_bytes.size());
  v.regular_tokens = n;
  // tiktoken merges a pair when the concatenation is a token, at that token's rank: every split of every
  // token into two tokens is a merge.
  std::unordered_map<std::string_view, int32_t> id;
  id.reserve(static_cast<size_t>(n) * 2);
  for (int32_t i = 0; i < n; ++i) {
    if (!id.emplace(v.token_bytes[static_cast<size_t>(i)], i).second)
      TRIDENT_THROW(InvalidArgument, "llama3 tokenizer: '{}': rank {} repeats the token of rank {}", path, i,
                    id[v.token_bytes[static_cast<size_t>(i)]]);
  }
  for (int32_t i = 0; i < n; ++i) {
    std::string_view t = v.token_bytes[static_cast<size_t>(i)];
    for (size_t k = 1; k < t.size(); ++k) {
      auto l = id.find(t.substr(0, k)), r = id.find(t.substr(k));
      if (l != id.end() && r != id.end()) v.merges.push_back({l->second, r->second, i, i});
    }
  }
  for (const auto& s : Llama3Bpe::special_tokens()) v.token_bytes.push_back(s);
  return v;
}

// The Split regexes of a tokenizer.json pre_tokenizer (nested Sequences included).
void split_patterns(const nlohmann::json& p, std::vector<std::string>& out) {
  if (!p.is_object()) return;
  if (p.value("type", "") == "Split" && p.contains("pattern") && p["pattern"].is_object()) {
    const auto& pat = p["pattern"];
    out.push_back(pat.contains("Regex") ? pat["Regex"].get<std::string>()
                                        : "string " + pat.value("String", std::string()));
  }
  if (p.contains("pretokenizers") && p["pretokenizers"].is_array())
    for (const auto& q : p["pretokenizers"]) split_patterns(q, out);
}

// Hugging Face's tokenizer.json.
ByteBpeVocab read_tokenizer_json(const std::string& path, const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    TRIDENT_THROW(InvalidArgument, "llama3 tokenizer: '{}' is not valid JSON: {}", path, e.what());
  }
  try {
    const auto& m = j.at("model");
    const std::string type = m.value("type", "BPE");
    if (type != "BPE") {
      TRIDENT_THROW(InvalidArgument, "llama3 tokenizer: '{}' holds a {} model; Llama 3's is a byte-level BPE", path,
                    type);
    }
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
      TRIDENT_THROW(InvalidArgument,
                    "llama3 tokenizer: '{}' has a normalizer ({}), which Llama 3's tokenizer does not have and "
                    "trident does not apply; is it another model's tokenizer?",
                    path, j["normalizer"].value("type", "?"));
    }
    if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) {
      std::vector<std::string> pats;
      split_patterns(j["pre_tokenizer"], pats);
      bool llama = false;
      for (const auto& p : pats) llama = llama || p == Llama3Bpe::kHfPattern;
      if (!llama) {
        TRIDENT_THROW(InvalidArgument,
                      "llama3 tokenizer: '{}' pre-tokenizes with {}, not Llama 3's pattern {}; trident's llama3 "
                      "tokenizer implements Llama 3's only",
                      path, pats.empty() ? std::string("no Split regex (GPT-2's ByteLevel?)") : "'" + pats[0] + "'",
                      Llama3Bpe::kHfPattern);
      }
    }
    ByteBpeVocab v;
    const auto& vocab = m.at("vocab");
    if (!vocab.is_object() || vocab.empty())
      TRIDENT_THROW(InvalidArgument, "llama3 tokenizer: '{}': model.vocab is empty", path);
    const size_t n = vocab.size();
    v.token_bytes.assign(n, std::string());
    std::vector<bool> seen(n, false);
    std::unordered_map<std::string, int32_t> id;  // token as spelled in the file -> id
    id.reserve(n * 2);
    for (const auto& [key, val] : vocab.items()) {
      if (!val.is_number_integer() || val.get<int64_t>() < 0 || val.get<int64_t>() >= static_cast<int64_t>(n)) {
        TRIDENT_THROW(InvalidArgument, "llama3 tokenizer: '{}': token '{}' has id {}, not in [0, {})", path, key,
                      val.dump(), n);
      }
      auto i = val.get<int32_t>();
      if (seen[static_cast<size_t>(i)]) TRIDENT_THROW(InvalidArgument, "llama3 tokenizer: '{}': id {} twice", path, i);
      seen[static_cast<size_t>(i)] = true;
      if (!byte_level_to_bytes(key, v.token_bytes[static_cast<size_t>(i)])) {
        TRIDENT_THROW(InvalidArgument,
                      "llama3 tokenizer: '{}': token '{}' is outside the byte-level alphabet, so this is not a "
                      "byte-level BPE (Llama 2's tokenizer is SentencePiece: --tokenizer sentencepiece with its "
                      "tokenizer.model)",
                      path, key);
      }
      id.emplace(key, i);
    }
    v.regular_tokens = static_cast<int32_t>(n);
    int32_t rank = 0;
    for (const auto& mg : m.at("merges")) {
      std::string a, b;
      if (mg.is_string()) {
        const auto& s = mg.get_ref<const std::string&>();
        size_t sp = s.find(' ', 1);
        if (sp == std::string::npos)
          TRIDENT_THROW(InvalidArgument, "llama3 tokenizer: '{}': merge '{}' is not \"A B\"", path, s);
        a = s.substr(0, sp), b = s.substr(sp + 1);
      } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
        a = mg[0].get<std::string>(), b = mg[1].get<std::string>();
      } else {
        TRIDENT_THROW(InvalidArgument, "llama3 tokenizer: '{}': merge {} is neither \"A B\" nor [\"A\", \"B\"]", path,
                      mg.dump());
      }
      auto ia = id.find(a), ib = id.find(b), im = id.find(a + b);
      if (ia == id.end() || ib == id.end() || im == id.end()) {
        TRIDENT_THROW(InvalidArgument, "llama3 tokenizer: '{}': merge '{} {}' names a token missing from model.vocab",
                      path, a, b);
      }
      v.merges.push_back({ia->second, ib->second, im->second, rank++});
    }
    // added_tokens: the special tokens, at ids from n on (an entry repeating a vocab token is allowed).
    if (j.contains("added_tokens")) {
      for (const auto& t : j["added_tokens"]) {
        const auto i = t.at("id").get<int64_t>();
        const auto content = t.at("content").get<std::string>();
        if (i < static_cast<int64_t>(n)) {
          std::string bytes;
          if (!byte_level_to_bytes(content, bytes) || bytes != v.token_bytes[static_cast<size_t>(i)]) {
            TRIDENT_THROW(InvalidArgument, "llama3 tokenizer: '{}': added token '{}' reuses id {} of another token",
                          path, content, i);
          }
          continue;
        }
        if (i >= (int64_t{1} << 30))
          TRIDENT_THROW(InvalidArgument, "llama3 tokenizer: '{}': added token id {}", path, i);
        if (static_cast<size_t>(i) >= v.token_bytes.size())
          v.token_bytes.resize(static_cast<size_t>(i) + 1), seen.resize(static_cast<size_t>(i) + 1, false);
        if (seen[static_cast<size_t>(i)])
          TRIDENT_THROW(InvalidArgument, "llama3 tokenizer: '{}': id {} twice", path, i);
        seen[static_cast<size_t>(i)] = true;
        v.token_bytes[static_cast<size_t>(i)] = content;
      }
    }
    for (size_t i = n; i < seen.size(); ++i) {
      if (!seen[i])
        TRIDENT_THROW(InvalidArgument, "llama3 tokenizer: '{}' has no token with id {} (added_tokens leave a gap)",
                      path, i);
    }
    return v;
  } catch (const nlohmann::json::exception& e) {
    TRIDENT_THROW(InvalidArgument, "llama3 tokenizer: '{}' is not a Hugging Face tokenizer.json: {}", path, e.what());
  }
}
}  // namespace

std::vector<std::string> Llama3Bpe::special_tokens() {
  std::vector<std::string> s = {"<|begin_of_text|>",
                                "<|end_of_text|>",
                                "<|reserved_special_token_0|>",
                                "<|reserved_special_token_1|>",
                                "<|finetune_right_pad_id|>",
                                "<|reserved_special_token_2|>",
                                "<|start_header_id|>",
                                "<|end_header_id|>",
                                "<|eom_id|>",
                                "<|eot_id|>",
                                "<|python_tag|>"};
  for (int i = 3; i <= 247; ++i) s.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  return s;
}

std::shared_ptr<const ByteBpe> Llama3Bpe::load(const std::string& path_in) {
  if (path_in.empty()) TRIDENT_THROW(InvalidArgument, "llama3 tokenizer: no file given; {}", kWhich);
  std::string path = path_in;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    path.clear();
    for (const char* name : {"tokenizer.json", "tokenizer.model", "original/tokenizer.model"}) {
      if (fs::is_regular_file(fs::path(path_in) / name, ec)) {
        path = (fs::path(path_in) / name).string();
        break;
      }
    }
    if (path.empty())
      TRIDENT_THROW(InvalidArgument, "llama3 tokenizer: folder '{}' holds no tokenizer file; {}", path_in, kWhich);
  }
  const std::string text = io::read_file(path);
  size_t first = text.find_first_not_of(" \t\r\n");
  ByteBpeVocab v =
      first != std::string::npos && text[first] == '{' ? read_tokenizer_json(path, text) : read_tiktoken(path, text);
  v.name = "llama3";
  v.path = path;
  v.fingerprint = io::fnv1a64(text);
  v.pattern = kPattern;
  v.ignore_merges = true;
  return std::make_shared<const ByteBpe>(std::move(v));
}

}  // namespace trident::data
