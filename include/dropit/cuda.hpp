#pragma once
/// @file
/// The CUDA backend as seen by code that is not compiled by nvcc: `cuda_backend` and the
/// declarations of its operations (`detail::backend_ops<cuda_backend>`), for float, half and
/// bfloat16. With it, the public entry points (compress, densify, the weight gradients, the ReLU
/// mask and their workspace queries) take a `cuda_backend` as they take the CPU one. A host
/// compiler (g++, clang) only needs the CUDA runtime's headers to include this; the definitions are
/// in `dropit.cuh`, and one translation unit compiled by nvcc instantiates them for a program:
/// `dropit/cuda_instances.cu` (CMake: link `dropit::cuda_instances`). That is how the LibTorch
/// adapters, compiled by the host compiler against LibTorch's headers (which nvcc cannot compile
/// as C++20), reach the CUDA kernels.
///
/// Semantics: buffers are device-accessible (device memory of the current device, managed or
/// pinned memory), the call validates on the host and throws `dropit::error`, enqueues its kernels
/// on `backend.stream`, allocates nothing and never synchronises the device, so buffers must stay
/// alive until the stream has run the work. Results equal the CPU backend's: kept sets, values and
/// cache bytes bit for bit; weight gradients up to float summation order. Errors of kernels that
/// already ran surface at the caller's next CUDA synchronisation, as usual.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include "detail/cuda/runtime.hpp"
#include "dropit.hpp"

namespace dropit {

/// Execution on a CUDA device, asynchronous on `stream` (the legacy default stream when null), on
/// the device current when the call is made.
struct cuda_backend {
  cudaStream_t stream = nullptr;
  /// Set by a caller that guarantees every operand is memory of the current device (the LibTorch
  /// adapters: each tensor is on the device they make current, checked or allocated there). The
  /// entry points then skip their driver query per operand (`cudaPointerGetAttributes`), a host
  /// cost of every call; left false, a pointer the device cannot read is refused with its name.
  bool operands_on_current_device = false;
  /// Whether float weight gradients may run on TF32 tensor cores (10-bit mantissa products, float
  /// sums), as torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32 let
  /// torch's. Off, they are full FP32 and equal the CPU backend's up to summation order.
  bool allow_tf32 = false;
  /// Where the library is built with cuDNN (`dropit::cuda_cudnn`), whether conv2d weight gradients
  /// run cuDNN's backward-filter convolution (for geometries one of its engines runs). Off, they
  /// take the backend's im2col + cuBLAS path, as torch.backends.cudnn.enabled = False takes torch's
  /// convolutions off cuDNN. Without cuDNN built in, the im2col path runs either way.
  bool use_cudnn = true;
};

namespace detail {

template <>
struct backend_ops<cuda_backend> {
  static constexpr const char* name = "CUDA";

  static void expect_accessible(const cuda_backend& backend, const void* pointer, std::size_t bytes,
                                const char* what) {
    if (!backend.operands_on_current_device) cuda::expect_device_accessible(pointer, bytes, what);
  }

  /// compress reads `input` contiguous, or channels-last where `channels_last` is set.
  template <storage_type T>
  static std::size_t compress_workspace_bytes(
      const cuda_backend&, const cache_layout& layout,
      const std::optional<channels_last_dims>& channels_last);
  template <storage_type T>
  static void compress(const cuda_backend& backend, const T* input,
                       const std::optional<channels_last_dims>& channels_last,
                       const cache_view<T>& out, workspace memory);

  template <storage_type T>
  static std::size_t densify_workspace_bytes(const cuda_backend&, const cache_layout& layout);
  template <storage_type T>
  static void densify(const cuda_backend& backend, const cache_view<const T>& cache, T* out,
                      workspace memory);

  template <storage_type T>
  static std::size_t linear_weight_grad_workspace_bytes(const cuda_backend&, const cache_layout& a,
                                                        const linear_dims& d);
  template <storage_type T>
  static void linear_weight_grad(const cuda_backend& backend, const cache_view<const T>& a,
                                 const T* dz, T* dw, const linear_dims& d, grad_mode mode,
                                 workspace memory);

  template <storage_type T>
  static std::size_t conv2d_weight_grad_workspace_bytes(const cuda_backend&, const cache_layout& x,
                                                        const conv2d_geometry& g);
  template <storage_type T>
  static void conv2d_weight_grad(const cuda_backend& backend, const cache_view<const T>& x,
                                 const T* dz, T* dw, const conv2d_geometry& g, grad_mode mode,
                                 workspace memory);

  template <storage_type T>
  static void pack_relu_mask(const cuda_backend& backend, const T* x, T* y, std::int64_t n,
                             std::uint32_t* words);
  template <storage_type T>
  static void apply_relu_mask(const cuda_backend& backend, const std::uint32_t* words, const T* dy,
                              T* dx, std::int64_t n);
  template <storage_type T>
  static void pack_relu_mask_channels_last(const cuda_backend& backend, const T* x, T* y,
                                           const channels_last_dims& d, std::uint32_t* words);
  template <storage_type T>
  static void apply_relu_mask_channels_last(const cuda_backend& backend,
                                            const std::uint32_t* words, const T* dy, T* dx,
                                            const channels_last_dims& d);
};

}  // namespace detail
}  // namespace dropit
