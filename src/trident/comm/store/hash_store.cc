#include "trident/comm/store/hash_store.h"

#include <fmt/ranges.h>

#include "trident/core/error.h"

namespace trident {

int64_t store_parse_int(const Bytes& b, const std::string& key) {
  std::string s(b.begin(), b.end());
  size_t pos = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (s.empty() || pos != s.size())
    TRIDENT_THROW(StoreError, "store key '{}' holds '{}', not an integer: add() needs an integer value", key, s);
  return v;
}

Bytes store_format_int(int64_t v) {
  std::string s = std::to_string(v);
  return Bytes(s.begin(), s.end());
}

void HashStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    map_[key] = value;
  }
  cv_.notify_all();
}

void HashStore::wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                            std::optional<Seconds> timeout) {
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout.value_or(timeout_));
  auto all_present = [&] {
    for (auto& k : keys)
      if (!map_.count(k)) return false;
    return true;
  };
  if (!cv_.wait_until(lock, deadline, all_present)) {
    std::vector<std::string> missing;
    for (auto& k : keys)
      if (!map_.count(k)) missing.push_back(k);
    TRIDENT_THROW(TimeoutError, "store wait timed out after {:.1f}s; missing keys: {}",
                  timeout.value_or(timeout_).count(), fmt::join(missing, ", "));
  }
}

Bytes HashStore::get(const std::string& key, std::optional<Seconds> timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  wait_locked(lock, {key}, timeout);
  return map_[key];
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t v;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    v = (it == map_.end() ? 0 : store_parse_int(it->second, key)) + delta;
    map_[key] = store_format_int(v);
  }
  cv_.notify_all();
  return v;
}

Bytes HashStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  Bytes out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) {
      if (expected.empty()) map_[key] = desired, out = desired;
      else out = Bytes{};  // absent, and the caller expected a value: nothing set
    } else if (it->second == expected) {
      it->second = desired;
      out = desired;
    } else {
      out = it->second;
    }
  }
  cv_.notify_all();
  return out;
}

void HashStore::wait(const std::vector<std::string>& keys, std::optional<Seconds> timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  wait_locked(lock, keys, timeout);
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& k : keys)
    if (!map_.count(k)) return false;
  return true;
}

bool HashStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return map_.erase(key) > 0;
}

int64_t HashStore::num_keys() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(map_.size());
}

}  // namespace trident
