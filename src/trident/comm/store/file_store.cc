#include "trident/comm/store/file_store.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "trident/comm/store/hash_store.h"
#include "trident/core/error.h"

namespace trident {
namespace {

// Record: magic(4) key_len(4) value_len(4) key value; value_len == kDeleted marks a delete (no value bytes).
constexpr uint32_t kMagic = 0x31525354;  // "TSR1"
constexpr uint32_t kDeleted = 0xFFFFFFFFu;
constexpr size_t kHeader = 12;

void put_u32(std::string& out, uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);
  out.append(b, 4);
}
uint32_t get_u32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

std::string encode(const std::string& key, const Bytes* value) {
  if (key.size() >= kDeleted || (value && value->size() >= kDeleted))
    TRIDENT_THROW(StoreError, "file store: key '{}' or its value is too large (4 GiB limit)", key.substr(0, 64));
  std::string rec;
  rec.reserve(kHeader + key.size() + (value ? value->size() : 0));
  put_u32(rec, kMagic);
  put_u32(rec, static_cast<uint32_t>(key.size()));
  put_u32(rec, value ? static_cast<uint32_t>(value->size()) : kDeleted);
  rec += key;
  if (value) rec.append(reinterpret_cast<const char*>(value->data()), value->size());
  return rec;
}

Seconds remaining(std::chrono::steady_clock::time_point deadline) {
  return std::chrono::duration_cast<Seconds>(deadline - std::chrono::steady_clock::now());
}

}  // namespace

// Opens the file, takes the flock (shared or exclusive) and replays the records appended since the last look.
class FileStore::Locked {
 public:
  Locked(FileStore& s, bool exclusive) : s_(s) {
    do {
      fd_ = ::open(s_.path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    } while (fd_ < 0 && errno == EINTR);
    if (fd_ < 0) {
      int e = errno;
      TRIDENT_THROW(StoreError, "file store: cannot open '{}': {}; its folder must exist and be writable", s_.path_,
                    detail::errno_string(e));
    }
    int rc;
    do {
      rc = ::flock(fd_, exclusive ? LOCK_EX : LOCK_SH);
    } while (rc < 0 && errno == EINTR);
    if (rc < 0) {
      int e = errno;
      ::close(fd_);
      TRIDENT_THROW(StoreError, "file store: cannot lock '{}': {} (the filesystem must support flock)", s_.path_,
                    detail::errno_string(e));
    }
    try {
      replay(exclusive);
    } catch (...) {
      ::close(fd_);
      throw;
    }
  }
  ~Locked() { ::close(fd_); }  // closing releases the flock
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;

  // Appends one record at the end of the log and applies it to the view. Needs the exclusive lock.
  void append(const std::string& key, const Bytes* value) {
    std::string rec = encode(key, value);
    size_t done = 0;
    while (done < rec.size()) {
      ssize_t n = ::pwrite(fd_, rec.data() + done, rec.size() - done, static_cast<off_t>(s_.offset_ + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        int e = errno;
        TRIDENT_THROW(StoreError, "file store: cannot write '{}': {}", s_.path_, detail::errno_string(e));
      }
      done += static_cast<size_t>(n);
    }
    s_.offset_ += rec.size();
    if (value) s_.map_[key] = *value;
    else s_.map_.erase(key);
  }

 private:
  void replay(bool exclusive) {
    struct stat st;
    if (::fstat(fd_, &st) < 0) {
      int e = errno;
      TRIDENT_THROW(StoreError, "file store: cannot stat '{}': {}", s_.path_, detail::errno_string(e));
    }
    uint64_t size = static_cast<uint64_t>(st.st_size);
    if (size < s_.offset_) {  // the file was replaced or truncated by someone else: start over
      s_.map_.clear();
      s_.offset_ = 0;
    }
    if (size == s_.offset_) return;
    std::string buf(size - s_.offset_, '\0');
    size_t got = 0;
    while (got < buf.size()) {
      ssize_t n = ::pread(fd_, buf.data() + got, buf.size() - got, static_cast<off_t>(s_.offset_ + got));
      if (n < 0) {
        if (errno == EINTR) continue;
        int e = errno;
        TRIDENT_THROW(StoreError, "file store: cannot read '{}': {}", s_.path_, detail::errno_string(e));
      }
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    buf.resize(got);
    size_t pos = 0;
    while (buf.size() - pos >= kHeader) {
      const char* p = buf.data() + pos;
      if (get_u32(p) != kMagic)
        TRIDENT_THROW(StoreError, "file store: '{}' is corrupt at byte {} (not a trident store file?); remove it",
                      s_.path_, s_.offset_ + pos);
      uint64_t klen = get_u32(p + 4), vlen = get_u32(p + 8);
      uint64_t need = kHeader + klen + (vlen == kDeleted ? 0 : vlen);
      if (buf.size() - pos < need) break;  // torn tail
      std::string key(p + kHeader, klen);
      if (vlen == kDeleted) s_.map_.erase(key);
      else s_.map_[key] = Bytes(p + kHeader + klen, p + kHeader + klen + vlen);
      pos += need;
    }
    s_.offset_ += pos;
    if (exclusive && s_.offset_ < size) {
      // A writer died mid-record (only an exclusive holder appends): cut the torn tail so the log stays parsable.
      if (::ftruncate(fd_, static_cast<off_t>(s_.offset_)) < 0) {
        int e = errno;
        TRIDENT_THROW(StoreError, "file store: cannot repair torn tail of '{}': {}", s_.path_, detail::errno_string(e));
      }
    }
  }

  FileStore& s_;
  int fd_ = -1;
};

FileStore::FileStore(std::string path, Seconds timeout) : path_(std::move(path)) {
  timeout_ = timeout;
  std::lock_guard<std::mutex> lock(mu_);
  Locked f(*this, false);  // creates the file and checks that it can be locked
}

void FileStore::set(const std::string& key, const Bytes& value) {
  std::lock_guard<std::mutex> lock(mu_);
  Locked f(*this, true);
  f.append(key, &value);
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mu_);
  Locked f(*this, true);
  auto it = map_.find(key);
  int64_t v = (it == map_.end() ? 0 : store_parse_int(it->second, key)) + delta;
  Bytes b = store_format_int(v);
  f.append(key, &b);
  return v;
}

Bytes FileStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  std::lock_guard<std::mutex> lock(mu_);
  Locked f(*this, true);
  auto it = map_.find(key);
  if (it == map_.end()) {
    if (!expected.empty()) return Bytes{};
  } else if (it->second != expected) {
    return it->second;
  }
  f.append(key, &desired);
  return desired;
}

bool FileStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  Locked f(*this, true);
  if (!map_.count(key)) return false;
  f.append(key, nullptr);
  return true;
}

int64_t FileStore::num_keys() {
  std::lock_guard<std::mutex> lock(mu_);
  Locked f(*this, false);
  return static_cast<int64_t>(map_.size());
}

std::vector<std::string> FileStore::missing_keys(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  Locked f(*this, false);
  std::vector<std::string> missing;
  for (auto& k : keys)
    if (!map_.count(k)) missing.push_back(k);
  return missing;
}

bool FileStore::check(const std::vector<std::string>& keys) { return missing_keys(keys).empty(); }

void FileStore::wait(const std::vector<std::string>& keys, std::optional<Seconds> timeout) {
  poll_until(keys, timeout, nullptr);
}

Bytes FileStore::get(const std::string& key, std::optional<Seconds> timeout) {
  Bytes out;
  poll_until({key}, timeout, &out);
  return out;
}

// Polls until every key exists (copying the first key's value into *value, under the same lock, when asked),
// sleeping 1 ms growing to 20 ms between looks.
void FileStore::poll_until(const std::vector<std::string>& keys, std::optional<Seconds> timeout, Bytes* value) {
  Seconds t = timeout.value_or(timeout_);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(t);
  auto sleep = std::chrono::microseconds(1000);
  for (;;) {
    std::vector<std::string> missing;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Locked f(*this, false);
      for (auto& k : keys)
        if (!map_.count(k)) missing.push_back(k);
      if (missing.empty()) {
        if (value) *value = map_[keys.front()];
        return;
      }
    }
    Seconds left = remaining(deadline);
    if (left <= Seconds(0))
      TRIDENT_THROW(TimeoutError, "file store '{}': wait timed out after {:.1f}s; missing keys: {}", path_, t.count(),
                    fmt::join(missing, ", "));
    std::this_thread::sleep_for(std::min<Seconds>(sleep, left));
    sleep = std::min(sleep * 2, std::chrono::microseconds(20000));
  }
}

}  // namespace trident
