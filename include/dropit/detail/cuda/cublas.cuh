#pragma once
// cuBLAS as the CUDA backend uses it. One handle per host thread and device, created on first use
// and kept for the life of the process (destroying handles at exit would race the CUDA runtime's
// own teardown); each call binds it to the operation's stream and to a workspace carved from the
// caller's, so cuBLAS allocates nothing and orders its kernels with dropit's.

#include <cublas_v2.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../../backend.hpp"
#include "../../types.hpp"
#include "../common/geometry.hpp"
#include "../common/workspace.hpp"
#include "runtime.hpp"

namespace dropit::detail::cuda {

/// Throws `dropit::error` naming `what` and the cuBLAS status unless it is success.
inline void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail(what, ": cuBLAS error ", cublasGetStatusName(status), ": ", cublasGetStatusString(status));
}

/// This thread's handle for the current device.
inline cublasHandle_t cublas_handle(const char* what) {
  int device = 0;
  check(cudaGetDevice(&device), what);
  thread_local std::vector<cublasHandle_t> handles;
  const auto slot = static_cast<std::size_t>(device);
  if (handles.size() <= slot) handles.resize(slot + 1, nullptr);
  if (handles[slot] == nullptr) check_cublas(cublasCreate(&handles[slot]), what);
  return handles[slot];
}

/// The workspace cuBLAS gets, as it documents for its default (4 MiB), plus the slack to align it
/// to the 256 bytes cuBLAS requires.
inline constexpr std::size_t cublas_workspace_bytes = std::size_t{4} << 20;
inline constexpr std::size_t cublas_workspace_alignment = 256;

inline std::byte* add_cublas_workspace(workspace_carver& carver) {
  return carver.add<std::byte>(cublas_workspace_bytes + cublas_workspace_alignment);
}

template <class T>
inline constexpr cudaDataType_t cuda_data_type = std::is_same_v<T, float>  ? CUDA_R_32F
                                                 : std::is_same_v<T, half> ? CUDA_R_16F
                                                                           : CUDA_R_16BF;

/// This thread's handle, bound to `stream` and to the cuBLAS workspace carved by
/// add_cublas_workspace (aligned here), so that cuBLAS allocates nothing.
inline cublasHandle_t bind_cublas(cudaStream_t stream, std::byte* workspace, const char* what) {
  const cublasHandle_t handle = cublas_handle(what);
  check_cublas(cublasSetStream(handle, stream), what);
  const auto address = reinterpret_cast<std::uintptr_t>(workspace);
  std::byte* aligned =
      workspace + (cublas_workspace_alignment - address % cublas_workspace_alignment) %
                      cublas_workspace_alignment;
  check_cublas(cublasSetWorkspace(handle, aligned, cublas_workspace_bytes), what);
  return handle;
}

/// The linear weight gradient by one cublasGemmEx, accumulating in float (tensor cores for the
/// 16-bit types): row-major dW [N_out, K] (=, or += with `grad_mode::accumulate`) dZᵀ · A, with
/// A [M, K] and dZ [M, N_out] of type T. In cuBLAS's column-major terms: dWᵀ [K, N_out] =
/// Aᵀ [K, M] · dZ [M, N_out], where the row-major buffers are the transposes as they stand.
template <storage_type T>
void gemm_linear_weight_grad(cudaStream_t stream, const T* a, const T* dz, T* dw,
                             const linear_dims& d, grad_mode mode, std::byte* workspace) {
  constexpr const char* what = "linear_weight_grad (cuBLAS)";
  const cublasHandle_t handle = bind_cublas(stream, workspace, what);
  const float alpha = 1.0f, beta = mode == grad_mode::accumulate ? 1.0f : 0.0f;
  constexpr cudaDataType_t type = cuda_data_type<T>;
  check_cublas(
      cublasGemmEx_64(handle, CUBLAS_OP_N, CUBLAS_OP_T, d.in_features, d.out_features, d.rows,
                      &alpha, a, type, d.in_features, dz, type, d.out_features, &beta, dw, type,
                      d.in_features, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      what);
}

/// One block of samples of the conv2d weight gradient, one GEMM per group (strided batched),
/// accumulating in float: row-major dW_g [C_out/G, R] (=, or += with `accumulate`) dZrows_g
/// [C_out/G, L] · columns_gᵀ, where columns_g [R, L] is group g's im2col block (R = C_in/G · KH ·
/// KW rows) and dZrows_g its dZ rows, L = samples · H_out · W_out. Column-major: dW_gᵀ [R, C_out/G]
/// = columns_gᵀ [R, L] · dZrows_gᵀ [L, C_out/G], each buffer the transpose of its row-major self.
template <storage_type T>
void gemm_conv2d_weight_grad(cudaStream_t stream, const T* columns, const T* dz_rows, float* dw,
                             const conv2d_geometry& g, std::int64_t samples, bool accumulate,
                             std::byte* workspace) {
  constexpr const char* what = "conv2d_weight_grad (cuBLAS)";
  const cublasHandle_t handle = bind_cublas(stream, workspace, what);
  const std::int64_t rows = g.in_per_group() * g.kernel_h * g.kernel_w;
  const std::int64_t outputs = g.out_per_group();
  const std::int64_t length = samples * g.out_height * g.out_width;
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  constexpr cudaDataType_t type = cuda_data_type<T>;
  check_cublas(cublasGemmStridedBatchedEx_64(
                   handle, CUBLAS_OP_T, CUBLAS_OP_N, rows, outputs, length, &alpha, columns, type,
                   length, rows * length, dz_rows, type, length, outputs * length, &beta, dw,
                   CUDA_R_32F, rows, outputs * rows, g.groups, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT),
               what);
}

}  // namespace dropit::detail::cuda
