#pragma once
/// @file
/// Backend tags. Every operation takes one as its first argument, the way Thrust takes an
/// execution policy. The CUDA backend lives in `dropit.cuh`.

#include <cstddef>
#include <cstdint>
#include <span>

#include "config.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace dropit {

/// Host execution, parallel with OpenMP when the translation unit is compiled with it. Results do
/// not depend on the thread count: every thread owns a fixed part of the output.
struct cpu_backend {
  /// Threads to use; 0 takes OpenMP's default (1 without OpenMP).
  int threads = 0;

  int thread_count() const {
#if defined(_OPENMP)
    return threads > 0 ? threads : omp_get_max_threads();
#else
    return 1;
#endif
  }
};

inline constexpr cpu_backend cpu{};

/// Whether a weight gradient replaces or is added to what the output buffer holds.
enum class grad_mode : std::uint8_t { overwrite, accumulate };

/// Caller-provided scratch memory for the expert overloads.
using workspace = std::span<std::byte>;

}  // namespace dropit
