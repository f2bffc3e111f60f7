#include "torch_backend/c10d_store.h"

#include <string>
#include <thread>
#include <vector>

#include "comm/core/errors.h"

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
    // Short waits poll check() instead: a c10d store's wait that times out raises a c10::Error
    // (which records a backtrace) and, in a TCPStore, leaves a waiter on the server to cancel.
    // The fault-tolerant push-sum's recovery polls keys every 20 ms with 1 ms waits.
    // (0 means "no timeout" to c10d stores: their own wait.)
    if (timeout.count() > 0 && timeout <= kPollBelow) {
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      for (;;) {
        bool set = false;
        try {
          set = store_->check(keys);
        } catch (const std::exception& e) {  // an unreachable store: named as the long path names it
          throw TimeoutError("c10d store: keys [" + Names(keys) + "] not readable (" + e.what() + ")");
        }
        if (set) return;
        if (std::chrono::steady_clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      throw TimeoutError("c10d store: keys [" + Names(keys) + "] not set within " + std::to_string(timeout.count()) +
                         " ms");
    }
    try {
      store_->wait(keys, timeout);
    } catch (const std::exception& e) {
      // c10d stores report a timeout as c10::Error (or DistStoreError in 2.x): say which keys.
      throw TimeoutError("c10d store: keys [" + Names(keys) + "] not set within " + std::to_string(timeout.count()) +
                         " ms (" + e.what() + ")");
    }
  }

 private:
  static constexpr std::chrono::milliseconds kPollBelow{100};
  static std::string Names(const std::vector<std::string>& keys) {
    std::string names;
    for (const std::string& k : keys) names += (names.empty() ? "" : ", ") + k;
    return names;
  }

  c10::intrusive_ptr<::c10d::Store> store_;
};

}  // namespace

std::shared_ptr<Store> WrapC10dStore(c10::intrusive_ptr<::c10d::Store> store) {
  return std::make_shared<C10dStore>(std::move(store));
}

}  // namespace torch_backend
}  // namespace gossipcc
