#pragma once
// Handles of the CUDA libraries the backend calls (cuBLAS, cuDNN): one per host thread and device,
// created on first use and never destroyed (destroying them at exit would race the CUDA runtime's
// own teardown, which is why PyTorch keeps its own too). A host thread that ends returns its
// handles to a process-wide pool for the next thread, so threads that come and go do not each cost
// a handle.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <mutex>
#include <vector>

#include "runtime.hpp"

namespace dropit::detail::cuda {

/// `Library` names the handle type (`handle_type`) and makes a handle for the current device
/// (`static handle_type create(const char* what)`).
template <class Library>
class library_handles {
 public:
  using handle_type = typename Library::handle_type;

  /// This thread's handle for the current device: its own, a pooled one, or a new one.
  static handle_type current(const char* what) {
    int device = 0;
    check(cudaGetDevice(&device), what);
    thread_local thread_handles mine;
    const auto slot = static_cast<std::size_t>(device);
    if (mine.by_device.size() <= slot) mine.by_device.resize(slot + 1, nullptr);
    handle_type& handle = mine.by_device[slot];
    if (handle != nullptr) return handle;
    {
      pool& free = pool::instance();
      const std::lock_guard lock(free.mutex);
      if (slot < free.by_device.size() && !free.by_device[slot].empty()) {
        handle = free.by_device[slot].back();
        free.by_device[slot].pop_back();
        return handle;
      }
    }
    handle = Library::create(what);
    return handle;
  }

 private:
  /// Handles no thread holds, per device; never destroyed (see above).
  struct pool {
    std::mutex mutex;
    std::vector<std::vector<handle_type>> by_device;

    static pool& instance() {
      static auto* shared = new pool;
      return *shared;
    }
  };

  /// One thread's handles, by device; returned to the pool when the thread ends.
  struct thread_handles {
    std::vector<handle_type> by_device;

    ~thread_handles() {
      pool& free = pool::instance();
      const std::lock_guard lock(free.mutex);
      if (free.by_device.size() < by_device.size()) free.by_device.resize(by_device.size());
      for (std::size_t device = 0; device < by_device.size(); ++device)
        if (by_device[device] != nullptr) free.by_device[device].push_back(by_device[device]);
    }
  };
};

}  // namespace dropit::detail::cuda
