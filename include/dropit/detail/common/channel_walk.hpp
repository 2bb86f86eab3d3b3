#pragma once
// A grid-stride walk over the flat indices of an [outer, channels, inner] array (the CUDA
// backend's channel gather and densify; with one channel, an index's quotient and remainder, as
// a kept value's chunk in the offsets densify) that keeps each index's position (o, c, r) without
// dividing per element: the start and the stride are split into the three digits once, and each
// step adds the stride's digits with carries. Host and device code alike, so the CPU tests check it
// against the divisions it replaces.

#include <cstdint>

#include "../../config.hpp"

namespace dropit::detail {

struct channel_walk {
  std::int64_t o, c, r;
  std::int64_t step_o, step_c, step_r, channels, inner;

  /// At flat index `start`, stepping by `stride` (channels, inner > 0).
  DROPIT_HOST_DEVICE channel_walk(std::int64_t start, std::int64_t stride, std::int64_t channels,
                                  std::int64_t inner)
      : o(start / inner / channels),
        c(start / inner % channels),
        r(start % inner),
        step_o(stride / inner / channels),
        step_c(stride / inner % channels),
        step_r(stride % inner),
        channels(channels),
        inner(inner) {}

  /// The position of the index `stride` further. A digit plus its step (and a carry) stays below
  /// twice its radix, so one subtraction brings it back.
  DROPIT_HOST_DEVICE void advance() {
    r += step_r;
    const bool carry_r = r >= inner;
    if (carry_r) r -= inner;
    c += step_c + (carry_r ? 1 : 0);
    const bool carry_c = c >= channels;
    if (carry_c) c -= channels;
    o += step_o + (carry_c ? 1 : 0);
  }
};

}  // namespace dropit::detail
