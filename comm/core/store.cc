#include "comm/core/store.h"

#include <fcntl.h>
#include <gloo/rendezvous/store.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/core/errors.h"

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

std::string MissingKeysError(const std::vector<std::string>& missing, std::chrono::milliseconds timeout) {
  return absl::StrCat("store: keys [", absl::StrJoin(missing, ", "), "] did not appear within ", timeout.count(),
                      " ms");
}

// One file per key in a shared directory. Unlike Gloo's FileStore a key may be set again (the
// peer heartbeats need that): the value is written to a private temporary file and renamed
// over the key's file, so a reader sees the old or the new value, never a partial one.
class DirectoryStore : public Store {
 public:
  explicit DirectoryStore(std::string dir) : dir_(std::move(dir)) { mkdir(dir_.c_str(), 0700); }

  void set(const std::string& key, const std::vector<char>& value) override {
    static std::atomic<uint64_t> counter{0};
    const std::string path = Path(key);
    const std::string tmp = absl::StrCat(path, ".tmp.", getpid(), ".", counter++);
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(value.data(), static_cast<std::streamsize>(value.size()));
      if (!out) throw CommError(absl::StrCat("store: cannot write ", tmp, ": ", std::strerror(errno)));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      const int err = errno;
      std::remove(tmp.c_str());
      throw CommError(absl::StrCat("store: cannot rename ", tmp, " to ", path, ": ", std::strerror(err)));
    }
  }

  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override {
    wait({key}, timeout);
    std::ifstream in(Path(key), std::ios::binary);
    if (!in) throw CommError(absl::StrCat("store: cannot read key ", key, " in ", dir_));
    std::ostringstream buf;
    buf << in.rdbuf();
    const std::string s = buf.str();
    return std::vector<char>(s.begin(), s.end());
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      std::vector<std::string> missing;
      for (const auto& k : keys) {
        struct stat st;
        if (stat(Path(k).c_str(), &st) != 0) missing.push_back(k);
      }
      if (missing.empty()) return;
      if (std::chrono::steady_clock::now() >= deadline) throw TimeoutError(MissingKeysError(missing, timeout));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

 private:
  // Keys hold '/' and other characters a file name cannot: hex-encode them.
  std::string Path(const std::string& key) const {
    static const char* hex = "0123456789abcdef";
    std::string name;
    name.reserve(key.size() * 2);
    for (unsigned char c : key) {
      name.push_back(hex[c >> 4]);
      name.push_back(hex[c & 15]);
    }
    return absl::StrCat(dir_, "/", name);
  }
  const std::string dir_;
};

// In-process store for ranks running as threads; keys may be set again.
class MemoryStore : public Store {
 public:
  void set(const std::string& key, const std::vector<char>& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      map_[key] = value;
    }
    cv_.notify_all();
  }

  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return map_.count(key) > 0; })) {
      throw TimeoutError(MissingKeysError({key}, timeout));
    }
    return map_[key];
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    auto all = [&] {
      for (const auto& k : keys) {
        if (map_.count(k) == 0) return false;
      }
      return true;
    };
    if (!cv_.wait_for(lock, timeout, all)) {
      std::vector<std::string> missing;
      for (const auto& k : keys) {
        if (map_.count(k) == 0) missing.push_back(k);
      }
      throw TimeoutError(MissingKeysError(missing, timeout));
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<char>> map_;
};

}  // namespace

std::shared_ptr<Store> MakeFileStore(const std::string& path) { return std::make_shared<DirectoryStore>(path); }

std::shared_ptr<Store> MakeHashStore() { return std::make_shared<MemoryStore>(); }

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
