#pragma once
// Carving one caller-provided workspace into typed segments. It only does pointer arithmetic, so
// it lays out device workspaces as well as host ones; every backend uses it.

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "../../backend.hpp"
#include "../../config.hpp"

namespace dropit::detail {

/// Lays out typed, 64-byte aligned segments in one workspace. The same sequence of `add` calls
/// first sizes the workspace (no memory) and then hands out the segments (with memory), so the size
/// query and the use can never disagree. The size includes the slack to align any base address.
class workspace_carver {
 public:
  static constexpr std::size_t alignment = 64;

  workspace_carver() = default;
  explicit workspace_carver(workspace memory)
      : base_(memory.data()),
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

 private:
  std::byte* base_ = nullptr;
  std::size_t start_ = 0;
  std::size_t offset_ = 0;
};

/// The bytes of the workspace that `add_segments(carver)` lays out.
template <class AddSegments>
std::size_t workspace_bytes_of(AddSegments&& add_segments) {
  workspace_carver carver;
  add_segments(carver);
  return carver.bytes();
}

/// Checks that the caller's `memory` covers the `required` bytes `operation` asked for.
inline void expect_workspace_size(workspace memory, std::size_t required, const char* operation) {
  if (required == 0) return;
  expect(memory.data() != nullptr, operation, ": workspace is null but ", required,
         " bytes are required");
  expect(required <= memory.size(), operation, ": workspace of ", memory.size(),
         " bytes is smaller than the required ", required, " bytes");
}

}  // namespace dropit::detail
