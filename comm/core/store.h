// The rendezvous store ranks use to find each other (addresses, NCCL unique ids).
//
// A Store is a small key/value service shared by every rank of a group. gossipcc
// talks to it through this interface only, so any store can back a Communicator:
// Gloo's FileStore and HashStore (adapters below), a PrefixStore that namespaces
// another store, and c10d's stores (adapted in torch_backend/).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace gloo {
namespace rendezvous {
class Store;
}  // namespace rendezvous
}  // namespace gloo

namespace gossipcc {

class Store {
 public:
  virtual ~Store() = default;

  // Sets (or replaces) the value of `key`. Stores that accept each key once only (Gloo's own
  // stores, through WrapGlooStore) work for rendezvous but disable the peer heartbeats.
  virtual void set(const std::string& key, const std::vector<char>& value) = 0;
  // Blocks until `key` exists (or `timeout` passes: TimeoutError), then returns its value.
  virtual std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Blocks until every key exists; TimeoutError naming the missing keys otherwise.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
};

// Shares a directory between processes on one host (or a shared file system): one file per
// key, replaced atomically on set.
std::shared_ptr<Store> MakeFileStore(const std::string& path);
// In-process store: for ranks running as threads of one process.
std::shared_ptr<Store> MakeHashStore();
// Wraps any Gloo store.
std::shared_ptr<Store> WrapGlooStore(std::shared_ptr<gloo::rendezvous::Store> store);

// Prefixes every key with "<prefix>/" so several groups can share one store.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);
  void set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

 private:
  std::string Key(const std::string& key) const;
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace gossipcc
