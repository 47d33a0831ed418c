// File helpers shared by the dataset cache (data/) and checkpoints (train/): FNV-1a checksums, a
// read-only memory map, and atomic file writes.
//
// Ownership: MappedFile owns its mapping (move-only). Blocking: every call does synchronous file I/O.
// Thread-safety: functions are reentrant; the write-fault test hook is a process-wide setting meant for
// single-threaded tests. No timeouts (local files only).
//
// Atomic writes: the bytes go to "<path>.tmp.<pid>" in the same directory, are fsync'ed, renamed over
// <path>, and the directory is fsync'ed. A crash or a full disk at any point leaves either the old file or
// the new one, never a mix; on failure the temporary file is removed and an IoError names the file (and,
// for ENOSPC, says that the previous file is intact).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace trident::io {

// 64-bit FNV-1a. Chain calls by passing the previous value as `h`.
inline constexpr uint64_t kFnvOffset = 14695981039346656037ull;
uint64_t fnv1a64(const void* data, size_t n, uint64_t h = kFnvOffset);
inline uint64_t fnv1a64(std::string_view s, uint64_t h = kFnvOffset) { return fnv1a64(s.data(), s.size(), h); }
// Checksum of a whole file (streamed); throws IoError naming the file when it cannot be read.
uint64_t file_fnv1a64(const std::string& path);
std::string hex64(uint64_t v);  // 16 lowercase hex digits

// Whole-file read; throws IoError naming the file.
std::string read_file(const std::string& path);

// Sequential writer handed to atomic_write_file's callback. write() throws IoError on failure.
class FileWriter {
 public:
  FileWriter(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  uint64_t bytes_written() const { return written_; }
  uint64_t checksum() const { return hash_; }  // FNV-1a 64 of everything written so far

 private:
  int fd_;
  std::string path_;
  uint64_t written_ = 0;
  uint64_t hash_ = kFnvOffset;
};

// Writes `path` atomically (see the header comment). `previous_note` is appended to errors (e.g. "the
// previous checkpoint is intact"). `expected_bytes` (0: unknown) is the size `fill` will write: the space is
// reserved first (fallocate, where the file system supports it), so a full disk or a file size limit fails
// before any data is written, and errors name the bytes the file needs. A full disk (ENOSPC, EDQUOT) and the
// file size limit (EFBIG: RLIMIT_FSIZE, `ulimit -f`; SIGXFSZ must be ignored to see it) are reported as such,
// from write(2), fallocate and fsync alike. Returns the FNV-1a 64 checksum of the bytes written.
uint64_t atomic_write_file(const std::string& path, const std::function<void(FileWriter&)>& fill,
                           const std::string& previous_note = "the previous file, if any, is intact",
                           uint64_t expected_bytes = 0);

// fsync a directory so that a rename inside it is durable.
void fsync_dir(const std::string& dir);

// Read-only memory map of a whole file. An empty file maps to (nullptr, 0).
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void reset();
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

namespace testing {
// Test hook: after `fail_after_bytes` more bytes pass through FileWriter::write (across files), the next
// write fails with errno `err` (e.g. ENOSPC) as if the disk were full. A negative value disables it.
void set_write_fault(int64_t fail_after_bytes, int err);
// Test hook: the rename of the next atomic write fails with errno `err` (0 disables).
void set_rename_fault(int err);
// Test hook: the fsync of the next atomic write fails with errno `err` (0 disables), as a file system that
// allocates late reports a full disk (ENOSPC) only when the data is flushed.
void set_fsync_fault(int err);
}  // namespace testing

}  // namespace trident::io
