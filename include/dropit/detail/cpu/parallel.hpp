#pragma once
// Threading and scratch-memory plumbing of the CPU backend.

#include <algorithm>
#include <concepts>
#include <cstddef>
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

/// Lays out typed, 64-byte aligned segments in one workspace. The same sequence of `add` calls
/// first sizes the workspace (no memory) and then hands out the segments (with memory), so the size
/// query and the use can never disagree. The size includes the slack to align any base address.
class workspace_carver {
 public:
  static constexpr std::size_t alignment = 64;

  workspace_carver() = default;
  explicit workspace_carver(workspace memory)
      : base_(memory.data()),
        capacity_(memory.size()),
        start_((alignment - reinterpret_cast<std::uintptr_t>(memory.data()) % alignment) %
               alignment) {}

  /// A segment of `factors...` (multiplied) elements of type T. Sizes are checked: huge extents
  /// or parameters are refused here, not wrapped into a small workspace.
  template <class T, std::integral... Factors>
  T* add(Factors... factors) {
    std::size_t bytes = sizeof(T);
    ((bytes = checked_mul(bytes, static_cast<std::size_t>(factors), "workspace size")), ...);
    offset_ = checked_add(offset_, alignment - 1, "workspace size") / alignment * alignment;
    T* segment = base_ ? reinterpret_cast<T*>(base_ + start_ + offset_) : nullptr;
    offset_ = checked_add(offset_, bytes, "workspace size");
    return segment;
  }

  /// Bytes a workspace must have for everything added so far, whatever its alignment.
  std::size_t bytes() const { return offset_ == 0 ? 0 : offset_ + alignment - 1; }

  /// Checks that the caller's memory covers everything added so far.
  void expect_fits(const char* operation) const {
    if (offset_ == 0) return;
    expect(base_ != nullptr, operation, ": workspace is null but ", bytes(), " bytes are required");
    expect(bytes() <= capacity_, operation, ": workspace of ", capacity_,
           " bytes is smaller than the required ", bytes(), " bytes");
  }

 private:
  std::byte* base_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t start_ = 0;
  std::size_t offset_ = 0;
};

}  // namespace dropit::detail::cpu
