// Store: the key-value service ranks rendezvous through (c10d's Store, gloo's rendezvous store).
//
// Ownership: a Store is shared by the process groups built on it (std::shared_ptr). Thread-safety: every
// method may be called from any thread concurrently. Blocking: get() and wait() block until the keys exist
// or the deadline passes; every call has a deadline (the store's default timeout unless one is given) and
// throws TimeoutError naming the missing keys when it expires. Errors: StoreError for a refused or failed
// request (bad token, oversized value, lost server), TimeoutError for expiry.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace trident {

using Bytes = std::vector<uint8_t>;
using Seconds = std::chrono::duration<double>;

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Blocks until `key` exists (deadline: timeout or the default), then returns its value.
  virtual Bytes get(const std::string& key, std::optional<Seconds> timeout = std::nullopt) = 0;
  // Atomically adds `delta` to the integer stored at key (created as 0) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets key to `desired` if its current value equals `expected` (an empty `expected` means "key absent").
  // Returns the value now stored.
  virtual Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) = 0;
  // Blocks until every key exists.
  virtual void wait(const std::vector<std::string>& keys, std::optional<Seconds> timeout = std::nullopt) = 0;
  virtual bool check(const std::vector<std::string>& keys) = 0;  // all exist now, without blocking
  virtual bool delete_key(const std::string& key) = 0;            // true if it existed
  virtual int64_t num_keys() = 0;

  Seconds timeout() const { return timeout_; }
  void set_timeout(Seconds t) { timeout_ = t; }

  // Convenience for strings.
  void set_string(const std::string& key, const std::string& value) { set(key, Bytes(value.begin(), value.end())); }
  std::string get_string(const std::string& key, std::optional<Seconds> timeout = std::nullopt) {
    Bytes b = get(key, timeout);
    return std::string(b.begin(), b.end());
  }

 protected:
  Seconds timeout_{600.0};
};

// Gives each group and generation its own namespace: every key becomes prefix + "/" + key.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::optional<Seconds> timeout = std::nullopt) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, std::optional<Seconds> timeout = std::nullopt) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string k(const std::string& key) const { return prefix_ + "/" + key; }
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace trident
