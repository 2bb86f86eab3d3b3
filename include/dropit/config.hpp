#pragma once
/// @file
/// Build configuration, version and the library's single error type.

#include <concepts>
#include <limits>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#define DROPIT_VERSION_MAJOR 0
#define DROPIT_VERSION_MINOR 1
#define DROPIT_VERSION_PATCH 0

/// Marks functions that compile for both host and device. Empty without nvcc so the same headers
/// build with a plain C++ compiler.
#if defined(__CUDACC__)
#define DROPIT_HOST_DEVICE __host__ __device__
#else
#define DROPIT_HOST_DEVICE
#endif

namespace dropit {

/// The one exception type dropit throws. Messages name the offending value and what was expected.
class error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

namespace detail {

template <class... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  std::ostringstream message;
  message << "dropit: ";
  (message << ... << std::forward<Parts>(parts));
  throw error(message.str());
}

/// Throws `dropit::error` built from `parts` unless `condition` holds.
template <class... Parts>
void expect(bool condition, Parts&&... parts) {
  if (!condition) fail(std::forward<Parts>(parts)...);
}

/// `a * b`, or a `dropit::error` saying that the size `what...` overflows. Every size dropit derives
/// on the host from extents and parameters (element counts, output extents, workspace bytes) is
/// formed through this and `checked_add`, so no size wraps.
template <std::integral I, class... Parts>
I checked_mul(I a, I b, Parts&&... what) {
  I result{};
  if (__builtin_mul_overflow(a, b, &result))
    fail(std::forward<Parts>(what)..., " overflows: ", a, " * ", b, " exceeds ",
         std::numeric_limits<I>::max());
  return result;
}

/// `a + b`, or a `dropit::error` saying that the size `what...` overflows.
template <std::integral I, class... Parts>
I checked_add(I a, I b, Parts&&... what) {
  I result{};
  if (__builtin_add_overflow(a, b, &result))
    fail(std::forward<Parts>(what)..., " overflows: ", a, " + ", b, " exceeds ",
         std::numeric_limits<I>::max());
  return result;
}

/// `count` value-initialised elements for a convenience overload. A request no allocator can meet
/// (a huge planned tensor) is reported as a `dropit::error` naming the size, like other bad input.
template <class T>
std::vector<T> allocate(std::size_t count, const char* what) {
  try {
    return std::vector<T>(count);
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {
  }
  fail("cannot allocate ", what, ": ", count, " elements of ", sizeof(T), " bytes");
}

}  // namespace detail
}  // namespace dropit
