#pragma once
// The grid group of a cooperative launch as the emulated device runs it (tests/cuda/emulation):
// its blocks run at once, each on its own host thread, and wait for one another at the barrier.
#include "../cuda_emulation.hpp"

namespace cooperative_groups {

class grid_group {
 public:
  void sync() const { ::dropit_emulation::sync_grid(); }
};
inline grid_group this_grid() { return {}; }

}  // namespace cooperative_groups
