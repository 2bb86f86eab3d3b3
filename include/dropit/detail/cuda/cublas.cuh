#pragma once
// cuBLAS as the CUDA backend uses it. Handles are created on first use, per device, and live for
// the process (destroying them at exit would race the CUDA runtime's own teardown, which is why
// PyTorch keeps its own too); a host thread that ends returns its handles to a process-wide pool
// for the next thread, so threads that come and go do not each cost a handle. Each call binds the
// handle to the operation's stream and to a workspace carved from the caller's, so cuBLAS allocates
// nothing and orders its kernels with dropit's.

#include <cublas_v2.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
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

/// Handles no thread holds, per device; never destroyed (see above).
struct cublas_handle_pool {
  std::mutex mutex;
  std::vector<std::vector<cublasHandle_t>> free_by_device;

  static cublas_handle_pool& instance() {
    static auto* pool = new cublas_handle_pool;
    return *pool;
  }
};

/// One thread's handles, by device; returned to the pool when the thread ends.
struct thread_cublas_handles {
  std::vector<cublasHandle_t> by_device;

  ~thread_cublas_handles() {
    cublas_handle_pool& pool = cublas_handle_pool::instance();
    const std::lock_guard lock(pool.mutex);
    if (pool.free_by_device.size() < by_device.size()) pool.free_by_device.resize(by_device.size());
    for (std::size_t device = 0; device < by_device.size(); ++device)
      if (by_device[device] != nullptr) pool.free_by_device[device].push_back(by_device[device]);
  }
};

/// This thread's handle for the current device: a pooled one, else a new one. Reductions stay in
/// float even for 16-bit results (cuBLAS may otherwise split K and sum the parts in the output
/// type).
inline cublasHandle_t cublas_handle(const char* what) {
  int device = 0;
  check(cudaGetDevice(&device), what);
  thread_local thread_cublas_handles mine;
  const auto slot = static_cast<std::size_t>(device);
  if (mine.by_device.size() <= slot) mine.by_device.resize(slot + 1, nullptr);
  cublasHandle_t& handle = mine.by_device[slot];
  if (handle != nullptr) return handle;
  {
    cublas_handle_pool& pool = cublas_handle_pool::instance();
    const std::lock_guard lock(pool.mutex);
    if (slot < pool.free_by_device.size() && !pool.free_by_device[slot].empty()) {
      handle = pool.free_by_device[slot].back();
      pool.free_by_device[slot].pop_back();
      return handle;
    }
  }
  cublasHandle_t created = nullptr;
  check_cublas(cublasCreate(&created), what);
  check_cublas(cublasSetMathMode(created, static_cast<cublasMath_t>(
                                              CUBLAS_DEFAULT_MATH |
                                              CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
               what);
  handle = created;
  return handle;
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
/// 16-bit types): row-major dW [N_out, K] (=, or += with `accumulate`) dZᵀ · A, with A [M, K] and
/// dZ [M, N_out] of type T and dW of type `Out` (T, or float for a sum stored later). In cuBLAS's
/// column-major terms: dWᵀ [K, N_out] = Aᵀ [K, M] · dZ [M, N_out], where the row-major buffers are
/// the transposes as they stand.
template <storage_type T, class Out>
void gemm_linear_weight_grad(cudaStream_t stream, const T* a, const T* dz, Out* dw,
                             const linear_dims& d, bool accumulate, std::byte* workspace) {
  constexpr const char* what = "linear_weight_grad (cuBLAS)";
  const cublasHandle_t handle = bind_cublas(stream, workspace, what);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  constexpr cudaDataType_t type = cuda_data_type<T>;
  check_cublas(
      cublasGemmEx_64(handle, CUBLAS_OP_N, CUBLAS_OP_T, d.in_features, d.out_features, d.rows,
                      &alpha, a, type, d.in_features, dz, type, d.out_features, &beta, dw,
                      cuda_data_type<Out>, d.in_features, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
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
