#pragma once
/// @file
/// The one place that knows which LibTorch it is built against (Debian's 1.13 CPU build, or 2.x
/// with CUDA). Everything else in dropit::torch is version-agnostic.

// ATen and autograd only, not <torch/torch.h>: the adapters need no more, and code that includes
// them compiles in a third of the time. The modules add torch::nn (modules.hpp).
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>
#include <torch/version.h>

#include <cstdint>
#include <optional>
#include <variant>
#include <vector>

// Set by the dropit::torch CMake target when the LibTorch found was built with CUDA (some CPU
// packages ship the CUDA headers too, so their presence proves nothing).
#if defined(DROPIT_TORCH_WITH_CUDA) && DROPIT_TORCH_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#define DROPIT_TORCH_HAS_CUDA 1
#else
#define DROPIT_TORCH_HAS_CUDA 0
#endif

namespace dropit::torch::compat {

inline constexpr bool torch_at_least(int major, int minor) {
  return TORCH_VERSION_MAJOR > major ||
         (TORCH_VERSION_MAJOR == major && TORCH_VERSION_MINOR >= minor);
}

/// Options such as Conv2d's padding are c10::variant before LibTorch 2 and std::variant after.
#if TORCH_VERSION_MAJOR < 2
using c10::get_if;
using c10::holds_alternative;
#else
using std::get_if;
using std::holds_alternative;
#endif

/// autograd::Function::apply rejects undefined tensor arguments, so an absent bias travels as an
/// empty tensor and is turned back into an undefined one inside the function. (Its size is read
/// symbolically where LibTorch has symbolic sizes: under torch.compile with dynamic shapes a bias
/// has a symbolic size.)
inline at::Tensor optional_argument(const at::Tensor& tensor, const at::Tensor& like) {
  return tensor.defined() ? tensor : like.new_empty({0});
}
inline at::Tensor from_optional_argument(const at::Tensor& tensor) {
#if TORCH_VERSION_MAJOR >= 2
  return tensor.sym_numel() > 0 ? tensor : at::Tensor();
#else
  return tensor.numel() > 0 ? tensor : at::Tensor();
#endif
}

/// The dtype autocast runs `device`'s operations in, or nullopt where it is off.
inline std::optional<at::ScalarType> autocast_dtype(const at::Device& device) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  if (!(device.is_cpu() || device.is_cuda()) || !at::autocast::is_autocast_enabled(device.type()))
    return std::nullopt;
  return at::autocast::get_autocast_dtype(device.type());
#else
  if (device.is_cpu() && at::autocast::is_cpu_enabled())
    return at::autocast::get_autocast_cpu_dtype();
  if (device.is_cuda() && at::autocast::is_enabled()) return at::autocast::get_autocast_gpu_dtype();
  return std::nullopt;
#endif
}

/// The sizes of `t` as integers. Under torch.compile with dynamic shapes a size may be symbolic:
/// dropit plans a cache for concrete sizes, so each symbolic size is specialised (the compiled
/// graph is guarded on it) rather than refused.
inline std::vector<std::int64_t> static_sizes(const at::Tensor& t) {
#if TORCH_VERSION_MAJOR >= 2
  std::vector<std::int64_t> sizes;
  sizes.reserve(t.dim());
  for (const c10::SymInt& size : t.sym_sizes()) sizes.push_back(size.guard_int(__FILE__, __LINE__));
  return sizes;
#else
  return t.sizes().vec();
#endif
}

/// LibTorch 2.3 made `Allocator::copy_data` pure virtual (older versions do not have it) and
/// `Allocator::allocate` non-const.
#define DROPIT_TORCH_ALLOCATOR_COPY_DATA \
  (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3))
#if DROPIT_TORCH_ALLOCATOR_COPY_DATA
#define DROPIT_TORCH_ALLOCATE_CONST
#else
#define DROPIT_TORCH_ALLOCATE_CONST const
#endif

#if DROPIT_TORCH_HAS_CUDA
struct cuda_memory {
  std::int64_t current = 0, peak = 0;
};

/// Current and peak bytes the CUDA caching allocator has handed out on `device`.
inline cuda_memory cuda_allocated(int device) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  // Index 0 is StatType::AGGREGATE (both pools) in every LibTorch; the enum itself moved from
  // c10::cuda::CUDACachingAllocator to c10::CachingAllocator and then to c10.
  constexpr std::size_t aggregate = 0;
  const auto& all = stats.allocated_bytes[aggregate];
  return {all.current, all.peak};
}

inline void reset_cuda_peak(int device) { c10::cuda::CUDACachingAllocator::resetPeakStats(device); }
#endif

}  // namespace dropit::torch::compat
