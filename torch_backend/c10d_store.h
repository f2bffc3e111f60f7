// Adapts a c10d::Store (what init_process_group hands a backend) to gossipcc's Store.
#pragma once

#include <memory>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "comm/core/store.h"

namespace gossipcc {
namespace torch_backend {

std::shared_ptr<Store> WrapC10dStore(c10::intrusive_ptr<::c10d::Store> store);

}  // namespace torch_backend
}  // namespace gossipcc
