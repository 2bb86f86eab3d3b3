#pragma once
// Threading and scratch-memory plumbing of the CPU backend.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

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
/// first sizes the workspace (no base) and then hands out the segments (with a base), so the size
/// query and the use can never disagree.
class workspace_carver {
 public:
  workspace_carver() = default;
  explicit workspace_carver(workspace memory) : base_(memory.data()), capacity_(memory.size()) {}

  template <class T>
  T* add(std::size_t count) {
    offset_ = (offset_ + 63) / 64 * 64;
    T* segment = base_ ? reinterpret_cast<T*>(base_ + offset_) : nullptr;
    offset_ += count * sizeof(T);
    return segment;
  }

  std::size_t bytes() const { return offset_; }

  /// Checks that the caller's memory covers everything added so far.
  void expect_fits(const char* operation) const {
    expect(base_ != nullptr || offset_ == 0, operation, ": workspace is null but ", offset_,
           " bytes are required");
    expect(offset_ <= capacity_, operation, ": workspace of ", capacity_,
           " bytes is smaller than the required ", offset_, " bytes");
  }

 private:
  std::byte* base_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t offset_ = 0;
};

/// Owns workspace memory for the convenience overloads.
inline std::vector<std::byte> allocate_workspace(std::size_t bytes) {
  return std::vector<std::byte>(bytes + 64);
}

/// The 64-byte aligned span inside memory from `allocate_workspace`.
inline workspace aligned_span(std::vector<std::byte>& memory, std::size_t bytes) {
  auto address = reinterpret_cast<std::uintptr_t>(memory.data());
  const std::size_t shift = (64 - address % 64) % 64;
  return workspace(memory.data() + shift, bytes);
}

}  // namespace dropit::detail::cpu
