#include "trident/data/token_shards.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "trident/core/error.h"
#include "trident/data/dataset.h"
#include "trident/data/gpt2_bpe.h"

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

Shard open_shard(const std::string& path) {
  Shard s;
  s.path = path;
  s.map = io::MappedFile(path);
  const size_t bytes = s.map.size();
  int32_t head[3] = {0, 0, 0};
  if (bytes >= sizeof head) std::memcpy(head, s.map.data(), sizeof head);
  if (head[0] == kShardMagic) {
    if (head[1] != kShardVersion) {
      TRIDENT_THROW(IoError, "token shard '{}' has version {}; trident reads llm.c's version {} (uint16 tokens)",
                    path, head[1], kShardVersion);
    }
    const size_t header = kShardHeaderInts * sizeof(int32_t);
    if (bytes < header) TRIDENT_THROW(IoError, "token shard '{}' is truncated: {} bytes, less than its header", path, bytes);
    if (head[2] < 0 || bytes != header + static_cast<size_t>(head[2]) * 2) {
      TRIDENT_THROW(IoError,
                    "token shard '{}' is truncated or corrupt: its header says {} tokens ({} bytes with the header) "
                    "but the file has {} bytes",
                    path, head[2], header + static_cast<size_t>(std::max(head[2], 0)) * 2, bytes);
    }
    s.tokens = reinterpret_cast<const uint16_t*>(s.map.data() + header);
    s.count = static_cast<size_t>(head[2]);
  } else if (nanogpt_name(path)) {
    if (bytes % 2 != 0) TRIDENT_THROW(IoError, "token file '{}' has an odd size {}: not a uint16 array", path, bytes);
    s.tokens = reinterpret_cast<const uint16_t*>(s.map.data());
    s.count = bytes / 2;
  } else {
    TRIDENT_THROW(IoError,
                  "token shard '{}' does not start with llm.c's magic {} (found {}); only files named train.bin or "
                  "val.bin are read as nanoGPT's headerless uint16 arrays",
                  path, kShardMagic, head[0]);
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
    const size_t skip = static_cast<size_t>(reinterpret_cast<const uint8_t*>(s.tokens) - s.map.data());
    std::fseek(f, static_cast<long>(skip), SEEK_SET);
    std::vector<uint16_t> buf(1 << 20);
    size_t done = 0;
    while (done < s.count) {
      size_t n = std::fread(buf.data(), 2, std::min(buf.size(), s.count - done), f);
      if (n == 0) break;
      for (size_t i = 0; i < n; ++i) {
        if (buf[i] >= vocab_size) {
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

ShardWriter::ShardWriter(std::string dir, std::string name, std::string split, size_t shard_tokens)
    : dir_(std::move(dir)), name_(std::move(name)), split_(std::move(split)), shard_tokens_(shard_tokens) {
  TRIDENT_CHECK(shard_tokens_ >= 1 && shard_tokens_ <= static_cast<size_t>(INT32_MAX), InvalidArgument,
                "shard size {} tokens: need 1 .. {}", shard_tokens_, INT32_MAX);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) TRIDENT_THROW(IoError, "cannot create '{}': {}", dir_, ec.message());
}

void ShardWriter::append(const int32_t* ids, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] > 65535) {
      TRIDENT_THROW(InvalidArgument, "token id {} does not fit llm.c's uint16 shards (vocabulary above 65536)", ids[i]);
    }
    buf_.push_back(static_cast<uint16_t>(ids[i]));
    if (buf_.size() == shard_tokens_) flush();
  }
  total_ += n;
}

void ShardWriter::flush() {
  std::string path = (fs::path(dir_) / fmt::format("{}_{}_{:06d}.bin", name_, split_, written_.size())).string();
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(buf_.size());
  io::atomic_write_file(path, [&](io::FileWriter& w) {
    w.write(header, sizeof header);
    w.write(buf_.data(), buf_.size() * sizeof(uint16_t));
  });
  written_.push_back(path);
  buf_.clear();
}

std::vector<std::string> ShardWriter::finish() {
  if (!buf_.empty() || written_.empty()) flush();
  return written_;
}

namespace {
// Cuts that change no tokenizer's output (Gpt2Bpe::is_neutral_cut; SentencePiece encodes line chunks).
// The last one in (0, limit], 0 if none; the first one at or after `from`, t.size() if none.
size_t last_safe_cut(std::string_view t, size_t limit) {
  for (size_t p = std::min(limit, t.size() - 1); p > 0; --p)
    if (Gpt2Bpe::is_neutral_cut(t, p)) return p;
  return 0;
}
size_t first_safe_cut(std::string_view t, size_t from) {
  for (size_t p = from; p < t.size(); ++p)
    if (Gpt2Bpe::is_neutral_cut(t, p)) return p;
  return t.size();
}
}  // namespace

TokenizeResult tokenize_to_shards(const Tokenizer& tok, const TokenizeOptions& o) {
  TRIDENT_CHECK(o.val_fraction >= 0 && o.val_fraction < 1, InvalidArgument, "--val_fraction {}: need [0, 1)",
                o.val_fraction);
  TRIDENT_CHECK(tok.vocab_size() <= 65536, InvalidArgument,
                "the tokenizer has {} tokens; llm.c's shards hold uint16 ids (at most 65536)", tok.vocab_size());
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
  ShardWriter train(o.out_dir, name, "train", o.shard_tokens), val(o.out_dir, name, "val", o.shard_tokens);
  TokenizeResult res;
  const int32_t eot = tok.end_of_text();
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
