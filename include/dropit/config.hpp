#pragma once
/// @file
/// Build configuration, version and the library's single error type.

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

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

}  // namespace detail
}  // namespace dropit
