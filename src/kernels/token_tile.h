// The interleaved kernels are templates over the tokens of a register tile (1..8), so that a
// token's float operations are the same whatever tile it shares: WithTokenTile calls `fn` with
// the tile's size as a compile-time constant (std::integral_constant).
#pragma once

#include <type_traits>

namespace substrate {

template <typename Fn>
inline void WithTokenTile(int nt, Fn&& fn) {
  switch (nt) {
    case 1: fn(std::integral_constant<int, 1>()); break;
    case 2: fn(std::integral_constant<int, 2>()); break;
    case 3: fn(std::integral_constant<int, 3>()); break;
    case 4: fn(std::integral_constant<int, 4>()); break;
    case 5: fn(std::integral_constant<int, 5>()); break;
    case 6: fn(std::integral_constant<int, 6>()); break;
    case 7: fn(std::integral_constant<int, 7>()); break;
    default: fn(std::integral_constant<int, 8>()); break;
  }
}

}  // namespace substrate
