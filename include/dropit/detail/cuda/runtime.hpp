#pragma once
// The CUDA runtime as the backend's host code uses it: errors turned into `dropit::error`, and the
// checks of where an operand's memory lives. Host-compiler friendly (no kernels), so `cuda.hpp`
// can use it too.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "../../config.hpp"

namespace dropit::detail::cuda {

/// Throws `dropit::error` naming `what` and the CUDA error unless `status` is cudaSuccess. The
/// runtime's last error is cleared first (a failed query leaves it set, and the next launch check,
/// dropit's or torch's, would report it again as its own); a sticky error stays, as it must.
inline void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  static_cast<void>(cudaGetLastError());
  fail(what, ": CUDA error ", cudaGetErrorName(status), ": ", cudaGetErrorString(status));
}

/// Checks, before an operation launches anything, that no error of earlier, unrelated work is
/// pending in this thread: the launch checks after each of dropit's kernels then report only what
/// that kernel caused. The pending error is reported, not cleared.
inline void expect_no_pending_error(const char* operation) {
  const cudaError_t pending = cudaPeekAtLastError();
  expect(pending == cudaSuccess, operation, ": an earlier CUDA error is pending (",
         cudaGetErrorName(pending), ": ", cudaGetErrorString(pending),
         "); it was raised before dropit launched anything");
}

/// Checks that a kernel launch was accepted (does not wait for the kernel).
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

/// Throws unless the current device can dereference `pointer` (`bytes` > 0 only: empty buffers may
/// be anything). Device memory must belong to the current device; pageable host memory is refused
/// except on systems where the device reads it (HMM, ATS); managed and pinned memory pass. Driver
/// queries only, no synchronisation.
inline void expect_device_accessible(const void* pointer, std::size_t bytes, const char* what) {
  if (pointer == nullptr || bytes == 0) return;
  cudaPointerAttributes attributes{};
  check(cudaPointerGetAttributes(&attributes, pointer), what);
  int device = 0;
  check(cudaGetDevice(&device), what);
  if (attributes.type == cudaMemoryTypeDevice) {
    expect(attributes.device == device, what, " is memory of CUDA device ", attributes.device,
           " but the operation runs on the current device ", device,
           "; make its device current (cudaSetDevice) or pass memory of device ", device);
    return;
  }
  if (attributes.type != cudaMemoryTypeUnregistered) return;
  int pageable = 0;
  check(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, device), what);
  expect(pageable != 0, what, " points to pageable host memory, which device ", device,
         " cannot access; expected device, managed or pinned memory");
}

/// `compute(device)` for the current device: computed once per process and device, under a lock
/// (`compute` may set an attribute every thread's launches rely on), then read from a per-thread
/// copy, so that later calls ask the runtime nothing but the current device and take no lock.
/// Each caller's `compute` (a lambda: a type of its own, in each instantiation of its caller) has
/// values of its own.
template <class Compute>
std::size_t once_per_device(const Compute& compute, const char* name) {
  int device = 0;
  check(cudaGetDevice(&device), name);
  thread_local std::vector<std::optional<std::size_t>> known;  // this thread's, by device
  const auto slot = static_cast<std::size_t>(device);
  if (slot < known.size() && known[slot]) return *known[slot];
  static std::mutex mutex;
  static std::unordered_map<int, std::size_t> computed;  // by device
  std::size_t value = 0;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto found = computed.find(device);
    value = found != computed.end() ? found->second
                                    : computed.emplace(device, compute(device)).first->second;
  }
  if (known.size() <= slot) known.resize(slot + 1);
  known[slot] = value;
  return value;
}

}  // namespace dropit::detail::cuda
