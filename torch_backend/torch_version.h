// The one place where torch 1.13 and torch 2.x differ for gossipcc.
//
// torch 1.13: Python routes collectives to a c10d::ProcessGroup subclass.
// torch 2.x:  c10d::ProcessGroup is a per-device container that dispatches to c10d::Backend
//             subclasses; the backend is registered for "cpu" and "cuda".
// Everything else in torch_backend/ is written against the aliases below.
#pragma once

#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace gossipcc {
namespace torch_backend {

#if TORCH_VERSION_MAJOR >= 2
using C10dBackendBase = ::c10d::Backend;
inline constexpr bool kTorchHasBackendClass = true;
#else
using C10dBackendBase = ::c10d::ProcessGroup;
inline constexpr bool kTorchHasBackendClass = false;
#endif

}  // namespace torch_backend
}  // namespace gossipcc
