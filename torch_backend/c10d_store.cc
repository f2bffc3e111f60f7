#include "torch_backend/c10d_store.h"

#include <string>
#include <vector>

#include "comm/errors.h"

namespace gossipcc {
namespace torch_backend {
namespace {

class C10dStore : public Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<::c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::vector<char>& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }

  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override {
    wait({key}, timeout);
    std::vector<uint8_t> value = store_->get(key);
    return std::vector<char>(value.begin(), value.end());
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    try {
      store_->wait(keys, timeout);
    } catch (const std::exception& e) {
      // c10d stores report a timeout as c10::Error (or DistStoreError in 2.x): say which keys.
      std::string names;
      for (const std::string& k : keys) names += (names.empty() ? "" : ", ") + k;
      throw TimeoutError("c10d store: keys [" + names + "] not set within " + std::to_string(timeout.count()) +
                         " ms (" + e.what() + ")");
    }
  }

 private:
  c10::intrusive_ptr<::c10d::Store> store_;
};

}  // namespace

std::shared_ptr<Store> WrapC10dStore(c10::intrusive_ptr<::c10d::Store> store) {
  return std::make_shared<C10dStore>(std::move(store));
}

}  // namespace torch_backend
}  // namespace gossipcc
