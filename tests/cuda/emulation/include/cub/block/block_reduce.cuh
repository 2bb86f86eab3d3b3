#pragma once
// cub::BlockReduce as the emulated device runs it (tests/cuda/emulation). As CUB documents, only
// thread 0 receives the total: the others get a value that is not it, so that code relying on
// theirs fails. As with CUB, the caller must pass a barrier before the storage is used again. The
// sum is taken in thread order, not in CUB's order: floating-point totals may differ in the last
// bits from a GPU's.
#include "../../../cuda_emulation.hpp"

namespace cub {

template <class T, int BlockThreads>
class BlockReduce {
 public:
  struct TempStorage {
    T inputs[BlockThreads];
  };
  explicit BlockReduce(TempStorage& storage) : storage_(storage) {}

  T Sum(T input) {
    ::dropit_emulation::expect_block_of(BlockThreads);
    storage_.inputs[threadIdx.x] = input;
    __syncthreads();
    T total{};
    for (unsigned t = 0; t < blockDim.x; ++t) total += storage_.inputs[t];
    return threadIdx.x == 0 ? total : total + T(1) + total;
  }

 private:
  TempStorage& storage_;
};

}  // namespace cub
