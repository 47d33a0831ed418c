#include "trident/data/token_shards.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "trident/core/error.h"
#include "trident/data/dataset.h"
#include "trident/data/byte_bpe.h"

namespace trident::data {
namespace fs = std::filesystem;

namespace {
bool is_bin(const fs::path& p) { return p.extension() == ".bin"; }
bool nanogpt_name(const fs::path& p) { return p.filename() == "train.bin" || p.filename() == "val.bin"; }
}  // namespace

bool is_token_source(const std::string& source) {
  std::error_code ec;
  if (fs::is_regular_file(source, ec)) return is_bin(source);
  if (!fs::is_directory(source, ec)) return false;
  for (const auto& e : fs::directory_iterator(source, ec))
    if (e.is_regular_file() && is_bin(e.path())) return true;
  return false;
}

int shard_version_for(int vocab_size, int want) {
  if (want == 0) return vocab_size <= 65536 ? kShardVersionU16 : kShardVersionU32;
  if (want == kShardVersionU32) return want;
  if (want != kShardVersionU16) {
    TRIDENT_THROW(InvalidArgument, "shard version {}: trident writes version 1 (uint16 tokens) or 2 (uint32 tokens)",
                  want);
  }
  if (vocab_size > 65536) {
    TRIDENT_THROW(InvalidArgument,
                  "the tokenizer has {} tokens but shard version 1 holds uint16 ids (at most 65536 tokens); write "
                  "version 2 (uint32 ids; the default for this vocabulary)",
                  vocab_size);
  }
  return want;
}

int32_t Shard::at(size_t i) const {
  if (width == 2) {
    uint16_t v;
    std::memcpy(&v, data + 2 * i, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, data + 4 * i, 4);
  return static_cast<int32_t>(v);
}

void Shard::copy(size_t begin, size_t n, int32_t* out) const {
  if (width == 4) {
    std::memcpy(out, data + 4 * begin, 4 * n);  // ids were checked below the vocabulary (< 2^31) on open
    return;
  }
  const auto* src = reinterpret_cast<const uint16_t*>(data) + begin;  // aligned: 1024-byte header, even offsets
  for (size_t i = 0; i < n; ++i) out[i] = src[i];
}

Shard open_shard(const std::string& path) {
  Shard s;
  s.path = path;
  s.map = io::MappedFile(path);
  const size_t bytes = s.map.size();
  int32_t head[3] = {0, 0, 0};
  if (bytes >= sizeof head) std::memcpy(head, s.map.data(), sizeof head);
  if (head[0] == kShardMagic || head[0] == kLlmcLlama3Magic) {
    if (head[0] == kShardMagic && head[1] == kShardVersionU16) {
      s.width = 2;
    } else if ((head[0] == kShardMagic && head[1] == kShardVersionU32) ||
               (head[0] == kLlmcLlama3Magic && head[1] == kLlmcLlama3Version)) {
      s.width = 4;
    } else {
      TRIDENT_THROW(IoError,
                    "token shard '{}' has magic {} and version {}; trident reads magic {} with version 1 (uint16 "
                    "tokens) or 2 (uint32 tokens), and llm.c's llama-3 shards (magic {}, version {})",
                    path, head[0], head[1], kShardMagic, kLlmcLlama3Magic, kLlmcLlama3Version);
    }
    const size_t header = kShardHeaderInts * sizeof(int32_t);
    if (bytes < header) TRIDENT_THROW(IoError, "token shard '{}' is truncated: {} bytes, less than its header", path, bytes);
    if (head[2] < 0 || bytes != header + static_cast<size_t>(head[2]) * s.width) {
      TRIDENT_THROW(IoError,
                    "token shard '{}' is truncated or corrupt: its header (version {}) says {} tokens of {} bytes ({} "
                    "bytes with the header) but the file has {} bytes",
                    path, head[1], head[2], s.width, header + static_cast<size_t>(std::max(head[2], 0)) * s.width,
                    bytes);
    }
    s.data = s.map.data() + header;
    s.count = static_cast<size_t>(head[2]);
  } else if (nanogpt_name(path)) {
    if (bytes % 2 != 0) TRIDENT_THROW(IoError, "token file '{}' has an odd size {}: not a uint16 array", path, bytes);
    s.data = s.map.data();
    s.width = 2;
    s.count = bytes / 2;
  } else {
    TRIDENT_THROW(IoError,
                  "token shard '{}' does not start with llm.c's magic {} or {} (found {}); only files named train.bin "
                  "or val.bin are read as nanoGPT's headerless uint16 arrays",
                  path, kShardMagic, kLlmcLlama3Magic, head[0]);
  }
  s.val = fs::path(path).filename().string().find("val") != std::string::npos;
  return s;
}

std::vector<Shard> open_token_source(const std::string& source, int vocab_size) {
  std::vector<std::string> paths;
  std::error_code ec;
  if (fs::is_directory(source, ec)) {
    for (const auto& e : fs::directory_iterator(source, ec))
      if (e.is_regular_file() && is_bin(e.path())) paths.push_back(e.path().string());
    std::sort(paths.begin(), paths.end());
  } else {
    paths.push_back(source);
  }
  if (paths.empty()) TRIDENT_THROW(InvalidArgument, "token source '{}' has no .bin shards", source);
  std::vector<Shard> train, val;
  for (const auto& p : paths) {
    Shard s = open_shard(p);
    if (paths.size() == 1) s.val = false;  // a single file is split 90/10
    // Check every id against the vocabulary, streaming through a buffer (the map's pages stay cold).
    std::FILE* f = std::fopen(p.c_str(), "rb");
    if (f == nullptr) TRIDENT_THROW(IoError, "cannot read '{}'", p);
    const size_t skip = static_cast<size_t>(s.data - s.map.data());
    std::fseek(f, static_cast<long>(skip), SEEK_SET);
    std::vector<uint8_t> raw((1 << 20) * s.width);
    std::vector<uint32_t> buf(1 << 20);
    size_t done = 0;
    while (done < s.count) {
      size_t n = std::fread(raw.data(), s.width, std::min(buf.size(), s.count - done), f);
      if (n == 0) break;
      for (size_t i = 0; i < n; ++i) {
        if (s.width == 2) {
          uint16_t v;
          std::memcpy(&v, raw.data() + 2 * i, 2);
          buf[i] = v;
        } else {
          std::memcpy(&buf[i], raw.data() + 4 * i, 4);
        }
      }
      for (size_t i = 0; i < n; ++i) {
        if (buf[i] >= static_cast<uint32_t>(vocab_size)) {
          std::fclose(f);
          TRIDENT_THROW(InvalidArgument,
                        "token shard '{}': token {} at position {} is not below the tokenizer's vocabulary size {}; "
                        "the shard was made with another tokenizer (pass the matching --tokenizer)",
                        p, buf[i], done + i, vocab_size);
        }
      }
      done += n;
    }
    std::fclose(f);
    (s.val ? val : train).push_back(std::move(s));
  }
  if (train.empty()) TRIDENT_THROW(InvalidArgument, "token source '{}' has validation shards only", source);
  for (auto& s : val) train.push_back(std::move(s));
  return train;
}

ShardWriter::ShardWriter(std::string dir, std::string name, std::string split, size_t shard_tokens, int version)
    : dir_(std::move(dir)),
      name_(std::move(name)),
      split_(std::move(split)),
      shard_tokens_(shard_tokens),
      version_(version),
      width_(version == kShardVersionU32 ? 4 : 2) {
  TRIDENT_CHECK(shard_tokens_ >= 1 && shard_tokens_ <= static_cast<size_t>(INT32_MAX), InvalidArgument,
                "shard size {} tokens: need 1 .. {}", shard_tokens_, INT32_MAX);
  TRIDENT_CHECK(version == kShardVersionU16 || version == kShardVersionU32, InvalidArgument,
                "shard version {}: trident writes version 1 (uint16 tokens) or 2 (uint32 tokens)", version);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) TRIDENT_THROW(IoError, "cannot create '{}': {}", dir_, ec.message());
}

void ShardWriter::append(const int32_t* ids, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || (width_ == 2 && ids[i] > 65535)) {
      TRIDENT_THROW(InvalidArgument, "token id {} does not fit shard version {} ({})", ids[i], version_,
                    width_ == 2 ? "uint16 ids below 65536; write version 2" : "uint32 ids of a non-negative int32");
    }
    if (buf_.empty()) buf_.reserve(std::min<size_t>(shard_tokens_, 1u << 24) * width_);
    if (width_ == 2) {
      auto v = static_cast<uint16_t>(ids[i]);
      const auto* p = reinterpret_cast<const uint8_t*>(&v);
      buf_.insert(buf_.end(), p, p + 2);
    } else {
      auto v = static_cast<uint32_t>(ids[i]);
      const auto* p = reinterpret_cast<const uint8_t*>(&v);
      buf_.insert(buf_.end(), p, p + 4);
    }
    if (++buffered_ == shard_tokens_) flush();
  }
  total_ += n;
}

void ShardWriter::flush() {
  std::string path = (fs::path(dir_) / fmt::format("{}_{}_{:06d}.bin", name_, split_, written_.size())).string();
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = version_;
  header[2] = static_cast<int32_t>(buffered_);
  io::atomic_write_file(path, [&](io::FileWriter& w) {
    w.write(header, sizeof header);
    w.write(buf_.data(), buf_.size());
  });
  written_.push_back(path);
  buf_.clear();
  buffered_ = 0;
}

std::vector<std::string> ShardWriter::finish() {
  if (!buf_.empty() || written_.empty()) flush();
  return written_;
}

namespace {
// Cuts that change no tokenizer's output (ByteBpe::is_neutral_cut; SentencePiece encodes line chunks).
// The last one in (0, limit], 0 if none; the first one at or after `from`, t.size() if none.
size_t last_safe_cut(std::string_view t, size_t limit) {
  for (size_t p = std::min(limit, t.size() - 1); p > 0; --p)
    if (ByteBpe::is_neutral_cut(t, p)) return p;
  return 0;
}
size_t first_safe_cut(std::string_view t, size_t from) {
  for (size_t p = from; p < t.size(); ++p)
    if (ByteBpe::is_neutral_cut(t, p)) return p;
  return t.size();
}
}  // namespace

TokenizeResult tokenize_to_shards(const Tokenizer& tok, const TokenizeOptions& o) {
  TRIDENT_CHECK(o.val_fraction >= 0 && o.val_fraction < 1, InvalidArgument, "--val_fraction {}: need [0, 1)",
                o.val_fraction);
  const int version = shard_version_for(tok.vocab_size(), o.shard_version);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> files = list_source_files(o.source);
  uint64_t total = 0;
  for (const auto& f : files) total += fs::file_size(f);
  const uint64_t val_from = static_cast<uint64_t>(static_cast<double>(total) * (1.0 - o.val_fraction));
  std::string name = o.name;
  if (name.empty()) {
    fs::path sp = fs::path(o.source).lexically_normal();
    if (sp.filename().empty()) sp = sp.parent_path();
    name = sp.stem().string();
  }
  ShardWriter train(o.out_dir, name, "train", o.shard_tokens, version),
      val(o.out_dir, name, "val", o.shard_tokens, version);
  TokenizeResult res;
  res.shard_version = version;
  const int32_t eot = tok.document_separator();
  uint64_t pos = 0;  // source bytes consumed before the current file
  bool in_val = o.val_fraction > 0 && val_from == 0;
  for (const auto& f : files) {
    std::FILE* in = std::fopen(f.c_str(), "rb");
    if (in == nullptr) TRIDENT_THROW(IoError, "cannot read '{}'", f);
    ++res.documents;
    if (eot >= 0) (in_val ? val : train).append(&eot, 1);
    std::string text;  // unencoded carry-over plus the new block
    bool eof = false;
    while (!eof || !text.empty()) {
      if (!eof) {
        size_t have = text.size();
        text.resize(have + o.block_bytes);
        size_t n = std::fread(text.data() + have, 1, o.block_bytes, in);
        text.resize(have + n);
        eof = n < o.block_bytes;
      }
      size_t cut = eof ? text.size() : last_safe_cut(text, text.size() - 1);
      if (cut == 0) cut = text.size();  // no safe cut in a whole block: cut at its end
      // The train/val boundary inside this piece: the first safe cut at or after val_from.
      if (!in_val && o.val_fraction > 0 && pos + cut > val_from) {
        size_t b = first_safe_cut(text, static_cast<size_t>(std::max<uint64_t>(val_from, pos) - pos));
        if (b < cut || eof) {
          b = std::min(b, cut);
          auto ids = tok.encode(std::string_view(text).substr(0, b), o.threads);
          train.append(ids.data(), ids.size());
          text.erase(0, b);
          pos += b;
          cut -= b;
          in_val = true;
        }
      }
      auto ids = tok.encode(std::string_view(text).substr(0, cut), o.threads);
      (in_val ? val : train).append(ids.data(), ids.size());
      text.erase(0, cut);
      pos += cut;
    }
    std::fclose(in);
  }
  res.bytes = total;
  res.train_tokens = train.tokens();
  res.val_tokens = val.tokens();
  for (auto& p : train.finish()) res.shards.push_back(p);
  if (val.tokens() > 0)
    for (auto& p : val.finish()) res.shards.push_back(p);
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace trident::data
