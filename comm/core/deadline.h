// Deadlines of the waits inside one operation.
#pragma once

#include <chrono>

namespace gossipcc {

// What is left of `deadline` for one Gloo wait, at least 1 ms (Gloo reads 0 as its default).
inline std::chrono::milliseconds TimeLeft(std::chrono::steady_clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return left > std::chrono::milliseconds(1) ? left : std::chrono::milliseconds(1);
}

}  // namespace gossipcc
