#pragma once
/// @file
/// Backend tags. Every operation takes one as its first argument, the way Thrust takes an
/// execution policy: each operation has one public entry point, templated on the backend, that
/// checks its arguments once and dispatches to `detail::backend_ops<Backend>`. The CPU backend is
/// always there; the CUDA backend is declared in `cuda.hpp` and defined in `dropit.cuh`.

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

namespace detail {

/// The operations a backend implements, as static members of a specialisation per backend:
/// `backend_ops<cpu_backend>` in detail/cpu/backend_ops.hpp, `backend_ops<cuda_backend>` in
/// cuda.hpp. They receive operands the entry point has checked (shapes, layouts, buffers, the
/// workspace's size and, through the backend's `expect_accessible`, where the memory lives).
/// The primary template is empty: a type without a specialisation is no backend.
template <class Backend>
struct backend_ops {};

}  // namespace detail

/// A type that selects a backend: one with a `detail::backend_ops` specialisation.
template <class Backend>
concept backend_type = requires {
  detail::backend_ops<Backend>::name;
};

}  // namespace dropit
