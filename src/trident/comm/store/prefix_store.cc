#include "trident/comm/store/store.h"

namespace trident {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  timeout_ = base_->timeout();
}
void PrefixStore::set(const std::string& key, const Bytes& value) { base_->set(k(key), value); }
Bytes PrefixStore::get(const std::string& key, std::optional<Seconds> timeout) {
  return base_->get(k(key), timeout.value_or(timeout_));
}
int64_t PrefixStore::add(const std::string& key, int64_t delta) { return base_->add(k(key), delta); }
Bytes PrefixStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return base_->compare_set(k(key), expected, desired);
}
void PrefixStore::wait(const std::vector<std::string>& keys, std::optional<Seconds> timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (auto& key : keys) full.push_back(k(key));
  base_->wait(full, timeout.value_or(timeout_));
}
bool PrefixStore::check(const std::vector<std::string>& keys) {
  std::vector<std::string> full;
  for (auto& key : keys) full.push_back(k(key));
  return base_->check(full);
}
bool PrefixStore::delete_key(const std::string& key) { return base_->delete_key(k(key)); }
int64_t PrefixStore::num_keys() { return base_->num_keys(); }

}  // namespace trident
