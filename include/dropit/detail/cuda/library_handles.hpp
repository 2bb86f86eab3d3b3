#pragma once
// Handles of the CUDA libraries the backend calls (cuBLAS, cuDNN): one per host thread and device,
// created on first use and never destroyed (destroying them at exit would race the CUDA runtime's
// own teardown, which is why PyTorch keeps its own too). A host thread that ends returns its
// handles to a process-wide pool for the next thread, so threads that come and go do not each cost
// a handle. Each handle remembers the stream and workspace it was last bound to, so that a call
// binds only what changed: a training loop's calls, on one stream, bind once.

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

  /// A thread's handle on one device and what the library was last told to use with it. Only
  /// the functions that bind it change the binding, and only after the library accepted it.
  struct bound_handle {
    handle_type handle = nullptr;
    bool stream_bound = false;  // a handle fresh from the library or the pool is bound to nothing
    cudaStream_t stream = nullptr;
    void* workspace = nullptr;  // the workspace given with the stream (none: the library's own)
  };

  /// This thread's handle for the current device (its own, a pooled one, or a new one), with its
  /// binding.
  static bound_handle& current(const char* what) {
    int device = 0;
    check(cudaGetDevice(&device), what);
    thread_local thread_handles mine;
    const auto slot = static_cast<std::size_t>(device);
    if (mine.by_device.size() <= slot) mine.by_device.resize(slot + 1);
    bound_handle& bound = mine.by_device[slot];
    if (bound.handle != nullptr) return bound;
    {
      pool& free = pool::instance();
      const std::lock_guard lock(free.mutex);
      if (slot < free.by_device.size() && !free.by_device[slot].empty()) {
        bound.handle = free.by_device[slot].back();
        free.by_device[slot].pop_back();
        return bound;
      }
    }
    bound.handle = Library::create(what);
    return bound;
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
    std::vector<bound_handle> by_device;

    ~thread_handles() {
      pool& free = pool::instance();
      const std::lock_guard lock(free.mutex);
      if (free.by_device.size() < by_device.size()) free.by_device.resize(by_device.size());
      for (std::size_t device = 0; device < by_device.size(); ++device)
        if (by_device[device].handle != nullptr)
          free.by_device[device].push_back(by_device[device].handle);
    }
  };
};

}  // namespace dropit::detail::cuda
