#include "comm/store.h"

#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/store.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/errors.h"

namespace gossipcc {
namespace {

// Gloo stores signal a timeout with gloo::IoException; map it to TimeoutError.
class GlooStoreAdapter : public Store {
 public:
  explicit GlooStoreAdapter(std::shared_ptr<gloo::rendezvous::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::vector<char>& value) override { store_->set(key, value); }

  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override {
    wait({key}, timeout);
    return store_->get(key);
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    try {
      store_->wait(keys, timeout);
    } catch (const std::exception& e) {
      throw TimeoutError(absl::StrCat("store: keys [", absl::StrJoin(keys, ", "), "] did not appear within ",
                                      timeout.count(), " ms: ", e.what()));
    }
  }

 private:
  std::shared_ptr<gloo::rendezvous::Store> store_;
};

}  // namespace

std::shared_ptr<Store> MakeFileStore(const std::string& path) {
  return std::make_shared<GlooStoreAdapter>(std::make_shared<gloo::rendezvous::FileStore>(path));
}

std::shared_ptr<Store> MakeHashStore() {
  return std::make_shared<GlooStoreAdapter>(std::make_shared<gloo::rendezvous::HashStore>());
}

std::shared_ptr<Store> WrapGlooStore(std::shared_ptr<gloo::rendezvous::Store> store) {
  return std::make_shared<GlooStoreAdapter>(std::move(store));
}

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {}

std::string PrefixStore::Key(const std::string& key) const { return absl::StrCat(prefix_, "/", key); }

void PrefixStore::set(const std::string& key, const std::vector<char>& value) { base_->set(Key(key), value); }

std::vector<char> PrefixStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  return base_->get(Key(key), timeout);
}

void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const auto& k : keys) prefixed.push_back(Key(k));
  base_->wait(prefixed, timeout);
}

}  // namespace gossipcc
