// The objects gossipcc's own collectives keep between calls (peer graphs, push-sum, D-PSGD and
// bilateral states, host groups, the quantized all-reduce's scratch): one per (type, key), made
// by the first call that asks and shared after. Lookups are thread-safe; the objects themselves
// are the caller's to synchronise (the process group uses them on its lanes only). Torch-free.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <typeindex>
#include <utility>

namespace gossipcc {
namespace torch_backend {

class AlgorithmCache {
 public:
  // The T under `key`, made by `make()` (a std::shared_ptr<T>) on first use, under the cache's
  // lock: at most once, and `make` must not use this cache. If `make` throws, nothing is kept.
  // T and const T name the same object.
  template <typename T, typename Make>
  std::shared_ptr<T> Get(const std::string& key, Make&& make) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(Key{typeid(T), key});
    if (it != objects_.end()) return std::static_pointer_cast<T>(it->second);
    std::shared_ptr<T> made = make();
    objects_.emplace(Key{typeid(T), key}, std::const_pointer_cast<std::remove_const_t<T>>(made));
    return made;
  }

  // The T under `key`, or null where none was made.
  template <typename T>
  std::shared_ptr<T> Find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(Key{typeid(T), key});
    return it == objects_.end() ? nullptr : std::static_pointer_cast<T>(it->second);
  }

  // Numbers 0, 1, 2, ... per counter, one per call.
  int Next(const std::string& counter) {
    std::lock_guard<std::mutex> lock(mu_);
    return counters_[counter]++;
  }

 private:
  using Key = std::pair<std::type_index, std::string>;
  std::mutex mu_;
  std::map<Key, std::shared_ptr<void>> objects_;
  std::map<std::string, int> counters_;
};

}  // namespace torch_backend
}  // namespace gossipcc
