#include "trident/data/dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "trident/core/error.h"
#include "trident/core/log.h"
#include "trident/data/file_io.h"
#include "trident/data/token_shards.h"

namespace trident::data {
namespace fs = std::filesystem;

namespace {
constexpr char kMagic[8] = {'T', 'R', 'I', 'D', 'T', 'O', 'K', '1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 80;

struct CacheHeader {
  char magic[8];
  uint32_t version;
  uint32_t token_bytes;  // 2 or 4
  uint64_t count;
  uint64_t source_checksum;
  uint64_t tokenizer_fingerprint;
  uint64_t tokens_checksum;
  uint64_t tokenizer_json_bytes;
  uint64_t data_offset;
  uint64_t reserved[2];
};
static_assert(sizeof(CacheHeader) == kHeaderBytes);

bool looks_binary(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  char buf[8192];
  size_t n = std::fread(buf, 1, sizeof buf, f);
  std::fclose(f);
  return std::memchr(buf, 0, n) != nullptr;
}
}  // namespace

std::vector<std::string> list_source_files(const std::string& source) {
  std::error_code ec;
  auto st = fs::status(source, ec);
  if (ec || !fs::exists(st)) {
    TRIDENT_THROW(InvalidArgument, "data source '{}' does not exist; give a text file or a folder of text files{}",
                  source,
                  source == "/usr/share/games/fortunes" ? " (install Debian's `fortunes` package, or pass --data FILE)"
                                                        : "");
  }
  if (fs::is_regular_file(st)) return {source};
  if (!fs::is_directory(st)) TRIDENT_THROW(InvalidArgument, "data source '{}' is neither a file nor a folder", source);
  std::vector<std::string> files;
  for (auto it = fs::recursive_directory_iterator(source, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const auto& p = it->path();
    std::string name = p.filename().string();
    if (!name.empty() && name[0] == '.') {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file() || it->is_symlink()) continue;
    files.push_back(p.string());
  }
  if (ec) TRIDENT_THROW(IoError, "cannot list data folder '{}': {}", source, ec.message());
  std::set<std::string> all(files.begin(), files.end());
  std::vector<std::string> kept;
  for (const auto& f : files) {
    if (all.count(f + ".u8")) continue;  // keep the UTF-8 twin of a pair
    if (looks_binary(f)) continue;       // strfile indexes (*.dat) and other binaries
    kept.push_back(f);
  }
  std::sort(kept.begin(), kept.end());
  if (kept.empty()) TRIDENT_THROW(InvalidArgument, "data folder '{}' contains no text files", source);
  return kept;
}

Split parse_split(const std::string& name) {
  if (name == "train") return Split::kTrain;
  if (name == "val") return Split::kVal;
  TRIDENT_THROW(InvalidArgument, "unknown split '{}'; allowed: train, val", name);
}

const char* split_name(Split s) { return s == Split::kTrain ? "train" : "val"; }

struct TokenDataset::Impl {
  Tokenizer tokenizer;
  std::vector<std::string> files;
  uint64_t source_checksum = 0;
  std::string cache_path;
  bool cache_hit = false;
  io::MappedFile map;
  std::vector<int32_t> memory;  // when not cached
  const uint8_t* tokens = nullptr;
  uint32_t token_bytes = 4;
  size_t count = 0;
  std::vector<Shard> shards;    // token shards (then `tokens` is unused)
  std::vector<size_t> starts;   // first token of each shard, and the total at the end
  size_t train_count = 0;       // shards: tokens of the training shards (0: the 90% rule)

  // Shards: the shard holding token i and its offset there.
  std::pair<size_t, size_t> locate(size_t i) const {
    size_t k = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), i) - starts.begin()) - 1;
    return {k, i - starts[k]};
  }

  int32_t at(size_t i) const {
    if (!shards.empty()) {
      auto [k, off] = locate(i);
      return shards[k].at(off);
    }
    if (token_bytes == 2) {
      uint16_t v;
      std::memcpy(&v, tokens + 2 * i, 2);
      return v;
    }
    int32_t v;
    std::memcpy(&v, tokens + 4 * i, 4);
    return v;
  }
};

namespace {
// Validates a cache file; returns false (with the reason) when it must be rebuilt.
bool try_load_cache(TokenDataset::Impl& d, const std::optional<Tokenizer>& want, TokenizerKind kind,
                    std::string& why) {
  io::MappedFile map(d.cache_path);
  if (map.size() < kHeaderBytes) return why = "truncated header", false;
  CacheHeader h;
  std::memcpy(&h, map.data(), sizeof h);
  if (std::memcmp(h.magic, kMagic, 8) != 0 || h.version != kVersion) return why = "not a trident token cache", false;
  if (h.source_checksum != d.source_checksum) return why = "the source changed", false;
  if (h.token_bytes != 2 && h.token_bytes != 4) return why = "bad token width", false;
  if (h.data_offset < kHeaderBytes + h.tokenizer_json_bytes || h.data_offset > map.size() ||
      (map.size() - h.data_offset) / h.token_bytes != h.count || (map.size() - h.data_offset) % h.token_bytes != 0) {
    return why = "its size does not match its header (truncated?)", false;
  }
  Tokenizer tok;
  try {
    tok = Tokenizer::from_json(nlohmann::json::parse(
        std::string_view(reinterpret_cast<const char*>(map.data()) + kHeaderBytes, h.tokenizer_json_bytes)));
  } catch (const std::exception& e) {
    return why = "its tokenizer description is corrupt", false;
  }
  if (tok.fingerprint() != h.tokenizer_fingerprint) return why = "its tokenizer fingerprint is wrong", false;
  if (tok.kind() != kind) return why = "it was built with another tokenizer", false;
  if (want && want->fingerprint() != tok.fingerprint()) return why = "it was built with another vocabulary", false;
  const uint8_t* tokens = map.data() + h.data_offset;
  if (io::fnv1a64(tokens, h.count * h.token_bytes) != h.tokens_checksum) return why = "its tokens are corrupt", false;
  d.tokenizer = std::move(tok);
  d.tokens = tokens;
  d.token_bytes = h.token_bytes;
  d.count = h.count;
  d.map = std::move(map);
  return true;
}
}  // namespace

TokenDataset TokenDataset::open(const DatasetOptions& opts) {
  auto d = std::make_shared<Impl>();
  if (is_token_source(opts.source)) {
    if (!opts.tokenizer_override && opts.tokenizer == TokenizerKind::kChar) {
      TRIDENT_THROW(InvalidArgument,
                    "data '{}' is token shards: name the tokenizer they were made with (--tokenizer gpt2, "
                    "llama3, sentencepiece or byte); the char tokenizer is defined by a text corpus",
                    opts.source);
    }
    d->tokenizer = opts.tokenizer_override ? *opts.tokenizer_override
                                           : Tokenizer::create(opts.tokenizer, opts.tokenizer_path);
    d->shards = open_token_source(opts.source, d->tokenizer.vocab_size());
    uint64_t h = io::kFnvOffset;
    d->starts.push_back(0);
    for (const auto& sh : d->shards) {
      d->files.push_back(sh.path);
      if (!sh.val) d->train_count += sh.count;
      d->starts.push_back(d->starts.back() + sh.count);
      uint64_t n = sh.count;
      h = io::fnv1a64(fs::path(sh.path).filename().string(), h);
      h = io::fnv1a64(&n, sizeof n, h);
    }
    if (d->train_count == d->starts.back()) d->train_count = 0;  // no val shards: 90/10
    d->count = d->starts.back();
    d->source_checksum = h;  // names and sizes: shards are too large to hash on every open
    if (d->count < 2) TRIDENT_THROW(InvalidArgument, "token source '{}' holds {} tokens", opts.source, d->count);
    TokenDataset ds;
    ds.impl_ = std::move(d);
    return ds;
  }
  d->files = list_source_files(opts.source);
  std::string text;
  uint64_t h = io::kFnvOffset;
  fs::path root = fs::is_directory(opts.source) ? fs::path(opts.source) : fs::path(opts.source).parent_path();
  for (const auto& f : d->files) {
    std::string content = io::read_file(f);
    std::string rel = d->files.size() == 1 ? std::string() : fs::relative(f, root).generic_string();
    h = io::fnv1a64(rel.data(), rel.size() + 0, h);
    uint64_t n = content.size();
    h = io::fnv1a64(&n, sizeof n, h);
    h = io::fnv1a64(content, h);
    text += content;
  }
  d->source_checksum = h;
  if (text.empty()) TRIDENT_THROW(InvalidArgument, "data source '{}' is empty", opts.source);
  TokenizerKind kind = opts.tokenizer_override ? opts.tokenizer_override->kind() : opts.tokenizer;
  // The tokenizer this dataset must use: the given one, or the corpus's own vocabulary.
  Tokenizer want = opts.tokenizer_override ? *opts.tokenizer_override
                   : kind == TokenizerKind::kChar ? Tokenizer::char_level(text)
                                                  : Tokenizer::create(kind, opts.tokenizer_path);

  if (!opts.cache_dir.empty()) {
    std::string abs = fs::absolute(opts.source).lexically_normal().string();
    d->cache_path = (fs::path(opts.cache_dir) /
                     fmt::format("tokens-{}-{}.bin", io::hex64(io::fnv1a64(abs)), tokenizer_kind_name(kind)))
                        .string();
    std::error_code ec;
    if (fs::exists(d->cache_path, ec)) {
      std::string why;
      if (try_load_cache(*d, want, kind, why)) {
        d->cache_hit = true;
        TokenDataset ds;
        ds.impl_ = std::move(d);
        return ds;
      }
      log_info("rebuilding token cache {}: {}", d->cache_path, why);
    }
  }

  d->tokenizer = std::move(want);
  std::vector<int32_t> ids = d->tokenizer.encode(text);
  text.clear();
  text.shrink_to_fit();

  if (!opts.cache_dir.empty()) {
    std::error_code ec;
    fs::create_directories(opts.cache_dir, ec);
    if (ec) TRIDENT_THROW(IoError, "cannot create cache folder '{}': {}", opts.cache_dir, ec.message());
    uint32_t width = d->tokenizer.vocab_size() <= 65536 ? 2 : 4;
    std::vector<uint8_t> packed(ids.size() * width);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (width == 2) {
        uint16_t v = static_cast<uint16_t>(ids[i]);
        std::memcpy(&packed[2 * i], &v, 2);
      } else {
        std::memcpy(&packed[4 * i], &ids[i], 4);
      }
    }
    std::string tok_json = d->tokenizer.to_json().dump();
    CacheHeader hdr{};
    std::memcpy(hdr.magic, kMagic, 8);
    hdr.version = kVersion;
    hdr.token_bytes = width;
    hdr.count = ids.size();
    hdr.source_checksum = d->source_checksum;
    hdr.tokenizer_fingerprint = d->tokenizer.fingerprint();
    hdr.tokens_checksum = io::fnv1a64(packed.data(), packed.size());
    hdr.tokenizer_json_bytes = tok_json.size();
    hdr.data_offset = (kHeaderBytes + tok_json.size() + 63) / 64 * 64;
    io::atomic_write_file(d->cache_path, [&](io::FileWriter& w) {
      w.write(&hdr, sizeof hdr);
      w.write(tok_json);
      std::string pad(hdr.data_offset - kHeaderBytes - tok_json.size(), '\0');
      w.write(pad);
      w.write(packed.data(), packed.size());
    });
    std::string why;
    if (!try_load_cache(*d, d->tokenizer, kind, why)) {
      TRIDENT_THROW(IoError, "token cache '{}' is unreadable right after writing it: {}", d->cache_path, why);
    }
  } else {
    d->memory = std::move(ids);
    d->tokens = reinterpret_cast<const uint8_t*>(d->memory.data());
    d->token_bytes = 4;
    d->count = d->memory.size();
  }
  TokenDataset ds;
  ds.impl_ = std::move(d);
  return ds;
}

size_t TokenDataset::size() const { return impl_->count; }
int32_t TokenDataset::at(size_t i) const { return impl_->at(i); }
void TokenDataset::copy(size_t begin, size_t n, int32_t* out) const {
  if (begin + n > impl_->count) {
    TRIDENT_THROW(InvalidArgument, "token range [{}, {}) is outside the dataset of {} tokens", begin, begin + n,
                  impl_->count);
  }
  if (!impl_->shards.empty()) {
    while (n > 0) {
      auto [k, off] = impl_->locate(begin);
      size_t take = std::min(n, impl_->shards[k].count - off);
      impl_->shards[k].copy(off, take, out);
      out += take;
      begin += take;
      n -= take;
    }
    return;
  }
  if (impl_->token_bytes == 4) {
    std::memcpy(out, impl_->tokens + 4 * begin, 4 * n);
  } else {
    const uint8_t* p = impl_->tokens + 2 * begin;
    for (size_t i = 0; i < n; ++i) {
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      out[i] = v;
    }
  }
}
const Tokenizer& TokenDataset::tokenizer() const { return impl_->tokenizer; }
size_t TokenDataset::train_size() const {
  if (impl_->train_count > 0) return impl_->train_count;
  return static_cast<size_t>(static_cast<double>(impl_->count) * 0.9);
}
TokenSpan TokenDataset::span(Split s) const {
  size_t n_train = train_size();
  if (s == Split::kTrain) return TokenSpan{*this, 0, n_train};
  return TokenSpan{*this, n_train, impl_->count - n_train};
}
const std::string& TokenDataset::cache_path() const { return impl_->cache_path; }
bool TokenDataset::cache_hit() const { return impl_->cache_hit; }
uint64_t TokenDataset::source_checksum() const { return impl_->source_checksum; }
const std::vector<std::string>& TokenDataset::files() const { return impl_->files; }

int32_t TokenSpan::at(size_t i) const { return dataset.at(begin + i); }
void TokenSpan::copy(size_t offset, size_t n, int32_t* out) const {
  if (offset + n > size) {
    TRIDENT_THROW(InvalidArgument, "token range [{}, {}) is outside the split of {} tokens", offset, offset + n, size);
  }
  dataset.copy(begin + offset, n, out);
}

}  // namespace trident::data
