#pragma once
// Threading of the CPU backend.

#include <algorithm>
#include <cstdint>

#include "../../backend.hpp"
#include "../../config.hpp"

namespace dropit::detail::cpu {

/// Calls `body(item, thread)` for every item in [0, count), spread over the backend's threads.
/// Work items own disjoint outputs, so the schedule never changes a result.
template <class Body>
void parallel_for(const cpu_backend& backend, std::int64_t count, Body&& body) {
  if (count <= 0) return;
#if defined(_OPENMP)
  const int threads = static_cast<int>(std::min<std::int64_t>(backend.thread_count(), count));
  if (threads > 1) {
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (std::int64_t item = 0; item < count; ++item) body(item, omp_get_thread_num());
    return;
  }
#else
  (void)backend;
#endif
  for (std::int64_t item = 0; item < count; ++item) body(item, 0);
}

}  // namespace dropit::detail::cpu
