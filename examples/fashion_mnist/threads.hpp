#pragma once
// One thread count for every library a training step runs in: torch's intra-op pool (OpenMP),
// dropit's CPU backend (which follows at::get_num_threads()) and OpenBLAS, which Debian's LibTorch
// calls for matrix products and which keeps its own pthread pool.

#include <ATen/Parallel.h>

// Resolved at run time from the OpenBLAS that LibTorch loads; null when LibTorch uses another BLAS.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace fmnist {

inline void set_threads(int threads) {
  at::set_num_threads(threads);
  if (openblas_set_num_threads != nullptr) openblas_set_num_threads(threads);
}

}  // namespace fmnist
