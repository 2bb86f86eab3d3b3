#pragma once
// A grid-stride walk over the flat indices of a row-major array that keeps each index's
// coordinates without dividing per element: the start and the stride are split into digits once
// (one per dimension, the outermost unbounded), and each step adds the stride's digits with
// carries. The CUDA backend's channel gather and densify walk [outer, channels, inner]; the offsets
// densify a kept value's (chunk, slot); the im2col weight gradient its columns' (channel, tap row,
// tap column, sample, output row, output column). The setup's divisions are paid once per thread:
// such kernels run on grids small enough that each thread takes many steps (grid_for_walk). Host
// and device code alike, so the CPU tests check it against the divisions it replaces.

#include <cstdint>

#include "../../config.hpp"

namespace dropit::detail {

template <int Rank>
struct index_walk {
  static_assert(Rank >= 2, "a walk of one dimension is the flat index itself");

  std::int64_t coordinate[Rank];  // outermost first
  std::int64_t step[Rank];        // the stride's digits
  std::int64_t extent[Rank];      // extent[0] is unused: the outermost coordinate is unbounded

  /// At flat index `start` (>= 0), stepping by `stride` (> 0), over dimensions whose extents are
  /// `inner_extents` (each > 0) below the outermost one.
  DROPIT_HOST_DEVICE index_walk(std::int64_t start, std::int64_t stride,
                                const std::int64_t (&inner_extents)[Rank - 1]) {
    extent[0] = 0;
    for (int d = Rank - 1; d >= 1; --d) {
      extent[d] = inner_extents[d - 1];
      coordinate[d] = start % extent[d];
      start /= extent[d];
      step[d] = stride % extent[d];
      stride /= extent[d];
    }
    coordinate[0] = start;
    step[0] = stride;
  }

  DROPIT_HOST_DEVICE std::int64_t operator[](int d) const { return coordinate[d]; }

  /// The coordinates of the index `stride` further. A digit plus its step (and a carry) stays
  /// below twice its extent, so one subtraction brings it back.
  DROPIT_HOST_DEVICE void advance() {
    bool carry = false;
    for (int d = Rank - 1; d >= 1; --d) {
      coordinate[d] += step[d] + (carry ? 1 : 0);
      carry = coordinate[d] >= extent[d];
      if (carry) coordinate[d] -= extent[d];
    }
    coordinate[0] += step[0] + (carry ? 1 : 0);
  }
};

}  // namespace dropit::detail
