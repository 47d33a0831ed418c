#include "trident/data/file_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <algorithm>
#include <vector>

#include "trident/core/error.h"

namespace trident::io {
namespace {
std::atomic<int64_t> g_fault_after{-1};
std::atomic<int> g_fault_errno{0};
std::atomic<int> g_rename_fault{0};
std::atomic<int> g_fsync_fault{0};

std::string parent_dir(const std::string& path) {
  auto p = std::filesystem::path(path).parent_path();
  return p.empty() ? std::string(".") : p.string();
}
}  // namespace

namespace testing {
void set_write_fault(int64_t fail_after_bytes, int err) {
  g_fault_errno = err;
  g_fault_after = fail_after_bytes;
}
void set_rename_fault(int err) { g_rename_fault = err; }
void set_fsync_fault(int err) { g_fsync_fault = err; }
}  // namespace testing

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

uint64_t file_fnv1a64(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) TRIDENT_THROW(IoError, "cannot open '{}': {}", path, detail::errno_string(errno));
  std::vector<char> buf(1 << 20);
  uint64_t h = kFnvOffset;
  for (;;) {
    ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      TRIDENT_THROW(IoError, "cannot read '{}': {}", path, detail::errno_string(e));
    }
    if (r == 0) break;
    h = fnv1a64(buf.data(), static_cast<size_t>(r), h);
  }
  ::close(fd);
  return h;
}

std::string read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) TRIDENT_THROW(IoError, "cannot open '{}': {}", path, detail::errno_string(errno));
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      TRIDENT_THROW(IoError, "cannot read '{}': {}", path, detail::errno_string(e));
    }
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  return out;
}

void FileWriter::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  size_t left = n;
  while (left > 0) {
    size_t chunk = left;
    int64_t budget = g_fault_after.load();
    if (budget >= 0) {
      if (budget == 0) {
        g_fault_after = -1;
        errno = g_fault_errno.load();
        throw std::system_error(errno, std::generic_category(), "injected write fault");
      }
      chunk = std::min<size_t>(chunk, static_cast<size_t>(budget));
    }
    ssize_t w = ::write(fd_, p, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(), "write");
    }
    if (budget >= 0) g_fault_after = budget - w;
    hash_ = fnv1a64(p, static_cast<size_t>(w), hash_);
    p += w;
    left -= static_cast<size_t>(w);
    written_ += static_cast<uint64_t>(w);
  }
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) TRIDENT_THROW(IoError, "cannot open directory '{}' to sync it: {}", dir, detail::errno_string(errno));
  ::fsync(fd);  // some file systems refuse fsync on directories; the rename is still atomic
  ::close(fd);
}

uint64_t atomic_write_file(const std::string& path, const std::function<void(FileWriter&)>& fill,
                           const std::string& previous_note, uint64_t expected_bytes) {
  std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    int e = errno;
    if (e == ENOSPC || e == EDQUOT) {
      TRIDENT_THROW(IoError, "no space left on device to create '{}'{}; {}; free some space and retry", tmp,
                    expected_bytes > 0 ? fmt::format(" (it needs {} bytes)", expected_bytes) : std::string(),
                    previous_note);
    }
    TRIDENT_THROW(IoError, "cannot create '{}': {}; {}", tmp, detail::errno_string(e), previous_note);
  }
  FileWriter w(fd, tmp);
  auto fail = [&](int e, const char* stage) {
    ::close(fd);
    ::unlink(tmp.c_str());
    const std::string size = expected_bytes > 0
                                 ? fmt::format("the file needs {} bytes, {} were written", expected_bytes,
                                               w.bytes_written())
                                 : fmt::format("{} bytes were written before it failed", w.bytes_written());
    if (e == ENOSPC || e == EDQUOT) {
      TRIDENT_THROW(IoError, "no space left on device while writing '{}' ({}; {}); {}; free some space and retry",
                    path, stage, size, previous_note);
    }
    if (e == EFBIG) {
      TRIDENT_THROW(IoError,
                    "file size limit reached while writing '{}' ({}; {}): the process may not write files that "
                    "large (RLIMIT_FSIZE, `ulimit -f`); {}; raise the limit and retry",
                    path, stage, size, previous_note);
    }
    TRIDENT_THROW(IoError, "cannot write '{}' ({}; {}): {}; {}", path, stage, size, detail::errno_string(e),
                  previous_note);
  };
  // Reserve the whole file first: a full disk or a size limit fails here, before any byte is written.
  // File systems without fallocate (EOPNOTSUPP) are written as they are.
  if (expected_bytes > 0 && ::fallocate(fd, 0, 0, static_cast<off_t>(expected_bytes)) != 0 &&
      errno != EOPNOTSUPP && errno != ENOSYS) {
    fail(errno, "reserving space");
  }
  try {
    fill(w);
  } catch (const std::system_error& e) {
    fail(e.code().value(), "write");
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (expected_bytes > 0 && w.bytes_written() < expected_bytes && ::ftruncate(fd, static_cast<off_t>(w.bytes_written())) != 0)
    fail(errno, "truncating the reservation");
  if (const int fault = g_fsync_fault.exchange(0); fault != 0) fail(fault, "fsync");
  if (::fsync(fd) != 0) fail(errno, "fsync");
  if (::close(fd) != 0) {
    int e = errno;
    fd = -1;
    ::unlink(tmp.c_str());
    TRIDENT_THROW(IoError, "cannot write '{}' (close): {}; {}", path, detail::errno_string(e), previous_note);
  }
  int rename_fault = g_rename_fault.exchange(0);
  if (rename_fault != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = rename_fault != 0 ? rename_fault : errno;
    ::unlink(tmp.c_str());
    TRIDENT_THROW(IoError, "cannot rename '{}' to '{}': {}; {}", tmp, path, detail::errno_string(e), previous_note);
  }
  fsync_dir(parent_dir(path));
  return w.checksum();
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) TRIDENT_THROW(IoError, "cannot open '{}': {}", path, detail::errno_string(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    TRIDENT_THROW(IoError, "cannot stat '{}': {}", path, detail::errno_string(e));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      TRIDENT_THROW(IoError, "cannot map '{}': {}", path, detail::errno_string(e));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

void MappedFile::reset() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

MappedFile::~MappedFile() { reset(); }

MappedFile::MappedFile(MappedFile&& o) noexcept : data_(o.data_), size_(o.size_), path_(std::move(o.path_)) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = o.data_;
    size_ = o.size_;
    path_ = std::move(o.path_);
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

}  // namespace trident::io
