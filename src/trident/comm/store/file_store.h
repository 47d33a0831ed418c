// FileStore: a Store over one file on a shared filesystem (forked test ranks; clusters with NFS), like
// c10d's FileStore.
//
// Design: the file is an append-only log of records (set key=value, or delete key). Every mutation takes an
// exclusive flock(2) on the file, replays the records appended since this handle last looked, applies the
// operation to that view (so add/compare_set are atomic across processes) and appends one record. Reads take
// a shared flock and replay. A record torn by a writer that died mid-append is cut off by the next writer.
//
// Ownership: the file is not removed by the store (the caller owns its path; tests use a temporary folder).
// Several FileStore objects, in any number of threads and processes (forked or not), may share one path.
// Thread-safety: every method may be called from any thread. A FileStore object may be used in a child
// after fork() (the file is opened afresh for each operation, so flock excludes parent and child too).
// Blocking: get() and wait() poll the file with short sleeps (1 ms growing to 20 ms) until the keys exist or
// the deadline passes, then throw TimeoutError naming the missing keys. Other calls block only on the lock.
// Errors: IoError/StoreError when the file cannot be opened, locked, read or written, or is corrupt.
#pragma once

#include <map>
#include <mutex>

#include "trident/comm/store/store.h"

namespace trident {

class FileStore : public Store {
 public:
  // Creates `path` if absent (its folder must exist). `timeout` is the default deadline of get() and wait().
  explicit FileStore(std::string path, Seconds timeout = Seconds(600.0));

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::optional<Seconds> timeout = std::nullopt) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, std::optional<Seconds> timeout = std::nullopt) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

  const std::string& path() const { return path_; }

 private:
  class Locked;  // an open, flocked file with the view brought up to date
  std::vector<std::string> missing_keys(const std::vector<std::string>& keys);
  void poll_until(const std::vector<std::string>& keys, std::optional<Seconds> timeout, Bytes* value);

  std::string path_;
  std::mutex mu_;                      // guards map_ and offset_ (and orders this process's threads)
  std::map<std::string, Bytes> map_;   // view of the log up to offset_
  uint64_t offset_ = 0;                // bytes of the log replayed into map_
};

}  // namespace trident
