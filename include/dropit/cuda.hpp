#pragma once
/// @file
/// The CUDA backend as seen by code that is not compiled by nvcc: `cuda_backend` and the
/// declarations of its operations (compress, densify, the weight gradients, the ReLU mask and their
/// workspace queries), for float, half and bfloat16. A host compiler (g++, clang) only needs the
/// CUDA runtime's headers to include it; the definitions are in `dropit.cuh`, and one translation
/// unit compiled by nvcc instantiates them for a program: `dropit/cuda_instances.cu` (CMake:
/// link `dropit::cuda_instances`). That is how the LibTorch adapters, compiled by the host compiler
/// against LibTorch's headers (which nvcc cannot compile as C++20), reach the CUDA kernels.
///
/// Semantics (see dropit.cuh): buffers are device-accessible, the call validates on the host and
/// throws `dropit::error`, enqueues its kernels on `backend.stream`, allocates nothing and never
/// synchronises the device.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "dropit.hpp"

namespace dropit {

/// Execution on a CUDA device, asynchronous on `stream` (the legacy default stream when null), on
/// the device current when the call is made.
struct cuda_backend {
  cudaStream_t stream = nullptr;
};

template <storage_type T>
std::size_t compress_workspace_bytes(const cuda_backend&, const cache_layout& layout);
template <storage_type T>
void compress(const cuda_backend& backend, tensor_view<const std::type_identity_t<T>> input,
              cache_view<T> out, workspace scratch);

template <storage_type T>
std::size_t densify_workspace_bytes(const cuda_backend&, const cache_layout& layout);
template <storage_type T>
void densify(const cuda_backend& backend, cache_view<const std::type_identity_t<T>> cache,
             tensor_view<T> out, workspace scratch);

template <storage_type T>
std::size_t linear_weight_grad_workspace_bytes(const cuda_backend&, const cache_layout& a,
                                               const shape& dz, const shape& dw);
template <storage_type T>
void linear_weight_grad(const cuda_backend& backend, cache_view<const std::type_identity_t<T>> a,
                        tensor_view<const std::type_identity_t<T>> dz, tensor_view<T> dw,
                        grad_mode mode, workspace scratch);

template <storage_type T>
std::size_t conv2d_weight_grad_workspace_bytes(const cuda_backend&, const cache_layout& x,
                                               const shape& dz, const shape& dw,
                                               const conv2d_params& params);
template <storage_type T>
void conv2d_weight_grad(const cuda_backend& backend, cache_view<const std::type_identity_t<T>> x,
                        tensor_view<const std::type_identity_t<T>> dz, tensor_view<T> dw,
                        const conv2d_params& params, grad_mode mode, workspace scratch);

template <storage_type T>
void pack_relu_mask(const cuda_backend& backend, tensor_view<const std::type_identity_t<T>> y,
                    std::uint32_t* words);
template <storage_type T>
void relu_with_mask(const cuda_backend& backend, tensor_view<const std::type_identity_t<T>> x,
                    tensor_view<T> y, std::uint32_t* words);
template <storage_type T>
void apply_relu_mask(const cuda_backend& backend, const std::uint32_t* words,
                     tensor_view<const std::type_identity_t<T>> dy, tensor_view<T> dx);

}  // namespace dropit
