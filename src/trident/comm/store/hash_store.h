// HashStore: an in-process Store for ranks run as threads in tests. Thread-safe; waits block on a
// condition variable until the keys exist or the deadline passes.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "trident/comm/store/store.h"

namespace trident {

class HashStore : public Store {
 public:
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::optional<Seconds> timeout = std::nullopt) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, std::optional<Seconds> timeout = std::nullopt) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

 private:
  void wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                   std::optional<Seconds> timeout);
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Bytes> map_;
};

// Integer values are stored as decimal text (as c10d does), so add() interoperates with get().
int64_t store_parse_int(const Bytes& b, const std::string& key);
Bytes store_format_int(int64_t v);

}  // namespace trident
