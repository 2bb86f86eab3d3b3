#pragma once
// One thread count for every library a training step runs in: torch's intra-op pool (OpenMP),
// dropit's CPU backend (which follows at::get_num_threads()) and OpenBLAS, which Debian's LibTorch
// calls for matrix products and which keeps its own pthread pool.

#include <ATen/Parallel.h>

#include <cstdlib>

#include <unistd.h>

// Resolved at run time from the OpenBLAS that LibTorch loads; null when LibTorch uses another BLAS.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace fmnist {

inline void set_threads(int threads) {
  at::set_num_threads(threads);
  if (openblas_set_num_threads != nullptr) openblas_set_num_threads(threads);
}

/// libgomp's default wait policy keeps its threads spinning after every parallel region, on the
/// cores OpenBLAS's own threads need next: the ViT's dense training step ran 2x slower that way on
/// 2 cores (the CNN, mostly oneDNN, did not change). libgomp reads the policy once, when it is
/// loaded, so when the user has not chosen one this re-executes the program with
/// OMP_WAIT_POLICY=passive.
inline void ensure_passive_openmp_wait(char** argv) {
#if defined(__linux__)
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  execv("/proc/self/exe", argv);  // returns only on failure: carry on with the default policy
#else
  (void)argv;
#endif
}

}  // namespace fmnist
