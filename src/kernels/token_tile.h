// Kernels templated over a small count (the tokens of a register tile, the rows or vectors of a
// tile) so that an element's float operations are the same whatever tile it shares: WithTile
// calls `fn` with the count as a compile-time constant (std::integral_constant).
#pragma once

#include <type_traits>
#include <utility>

namespace substrate {

// fn(integral_constant<int, n>) for n in 1..Max; any other n runs as Max.
template <int Max, typename Fn>
inline void WithTile(int n, Fn&& fn) {
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((n == I + 1 || I + 1 == Max ? (fn(std::integral_constant<int, I + 1>()), true) : false) ||
     ...);
  }(std::make_integer_sequence<int, Max>());
}

// The interleaved kernels' token tiles: 1..8 tokens.
template <typename Fn>
inline void WithTokenTile(int nt, Fn&& fn) {
  WithTile<8>(nt, std::forward<Fn>(fn));
}

}  // namespace substrate
