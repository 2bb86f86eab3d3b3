#pragma once
// cub::BlockScan as the emulated device runs it (tests/cuda/emulation): every thread's input
// through shared storage, a barrier, each thread's sum over the inputs of the threads up to it.
// As with CUB, the caller must pass a barrier before the storage is used again: without one, a
// thread's next input overwrites what others are still reading, and the results go wrong.
#include "../../../cuda_emulation.hpp"

namespace cub {

template <class T, int BlockThreads>
class BlockScan {
 public:
  struct TempStorage {
    T inputs[BlockThreads];
  };
  explicit BlockScan(TempStorage& storage) : storage_(storage) {}

  void InclusiveSum(T input, T& output) {
    T total{};
    output = sum_through(input, total);
  }
  void ExclusiveSum(T input, T& output) {
    T total{};
    output = sum_through(input, total) - input;
  }
  void ExclusiveSum(T input, T& output, T& block_aggregate) {
    output = sum_through(input, block_aggregate) - input;
  }

 private:
  T sum_through(T input, T& total) {
    const unsigned self = threadIdx.x;
    ::dropit_emulation::expect_block_of(BlockThreads);
    storage_.inputs[self] = input;
    __syncthreads();
    T through{};
    total = T{};
    for (unsigned t = 0; t < blockDim.x; ++t) {
      if (t <= self) through += storage_.inputs[t];
      total += storage_.inputs[t];
    }
    return through;
  }
  TempStorage& storage_;
};

}  // namespace cub
