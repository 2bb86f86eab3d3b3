#pragma once
// The grid group of a cooperative launch as the emulated device runs it (tests/cuda/emulation):
// its launches have one block, so the grid-wide barrier is the block's.
#include "../cuda_emulation.hpp"

namespace cooperative_groups {

class grid_group {
 public:
  void sync() const { __syncthreads(); }
};
inline grid_group this_grid() { return {}; }

}  // namespace cooperative_groups
