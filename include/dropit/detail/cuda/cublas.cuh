#pragma once
// cuBLAS as the CUDA backend uses it, with PyTorch's settings: float GEMMs in full FP32 unless the
// backend allows TF32 (as torch.backends.cuda.matmul.allow_tf32 does), and the workspace PyTorch
// gives cuBLAS on the device. Handles are per thread and device (library_handles.hpp). Each call
// binds the handle to the operation's stream and to a workspace carved from the caller's, so cuBLAS
// allocates nothing and orders its kernels with dropit's.

#include <cublas_v2.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../../backend.hpp"
#include "../../types.hpp"
#include "../common/geometry.hpp"
#include "../common/workspace.hpp"
#include "library_handles.hpp"
#include "runtime.hpp"

namespace dropit::detail::cuda {

/// Throws `dropit::error` naming `what` and the cuBLAS status unless it is success.
inline void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail(what, ": cuBLAS error ", cublasGetStatusName(status), ": ", cublasGetStatusString(status));
}

/// cuBLAS handles for library_handles. Reductions stay in float even for 16-bit results (cuBLAS
/// may otherwise split K and sum the parts in the output type).
struct cublas_library {
  using handle_type = cublasHandle_t;

  static cublasHandle_t create(const char* what) {
    cublasHandle_t created = nullptr;
    check_cublas(cublasCreate(&created), what);
    check_cublas(
        cublasSetMathMode(created, static_cast<cublasMath_t>(
                                       CUBLAS_DEFAULT_MATH |
                                       CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
        what);
    return created;
  }
};

/// The workspace cuBLAS gets on the current device, as PyTorch gives it (its
/// CUBLAS_WORKSPACE_CONFIG default): 32 MiB from Hopper (compute capability 9) on, 8 MiB + 128 KiB
/// before. Asked once per device.
inline std::size_t cublas_workspace_bytes(const char* what) {
  const auto bytes_for = [what](int device) {
    int major = 0;
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), what);
    return major >= 9 ? std::size_t{32} << 20 : (std::size_t{4096} * 2 + 16 * 8) << 10;
  };
  return once_per_device(bytes_for, what);
}

/// cuBLAS requires its workspace aligned to 256 bytes; the carved segment has the slack for it.
inline constexpr std::size_t cublas_workspace_alignment = 256;

inline std::byte* add_cublas_workspace(workspace_carver& carver) {
  return carver.add<std::byte>(cublas_workspace_bytes("cuBLAS workspace") +
                               cublas_workspace_alignment);
}

/// The compute type of a GEMM on T: float accumulation, on TF32 tensor cores for float operands
/// only where the backend allows TF32 (16-bit operands use tensor cores regardless).
template <class T>
cublasComputeType_t gemm_compute_type(bool allow_tf32) {
  return std::is_same_v<T, float> && allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                 : CUBLAS_COMPUTE_32F;
}

template <class T>
inline constexpr cudaDataType_t cuda_data_type = std::is_same_v<T, float>  ? CUDA_R_32F
                                                 : std::is_same_v<T, half> ? CUDA_R_16F
                                                                           : CUDA_R_16BF;

/// This thread's handle, bound to `stream` and to the cuBLAS workspace carved by
/// add_cublas_workspace (aligned here), so that cuBLAS allocates nothing. Only what changed since
/// the handle's last binding is set: cublasSetStream also puts back cuBLAS's own workspace, so a
/// new stream takes the workspace again.
inline cublasHandle_t bind_cublas(cudaStream_t stream, std::byte* workspace, const char* what) {
  auto& bound = library_handles<cublas_library>::current(what);
  if (!bound.stream_bound || bound.stream != stream) {
    check_cublas(cublasSetStream(bound.handle, stream), what);
    bound.stream = stream;
    bound.stream_bound = true;
    bound.workspace = nullptr;
  }
  const auto address = reinterpret_cast<std::uintptr_t>(workspace);
  std::byte* aligned =
      workspace + (cublas_workspace_alignment - address % cublas_workspace_alignment) %
                      cublas_workspace_alignment;
  if (bound.workspace != aligned) {
    check_cublas(cublasSetWorkspace(bound.handle, aligned, cublas_workspace_bytes(what)), what);
    bound.workspace = aligned;
  }
  return bound.handle;
}

/// The linear weight gradient by one cublasGemmEx, accumulating in float (tensor cores for the
/// 16-bit types): row-major dW [N_out, K] (=, or += with `accumulate`) dZᵀ · A, with A [M, K] and
/// dZ [M, N_out] of type T and dW of type `Out` (T, or float for a sum stored later). In cuBLAS's
/// column-major terms: dWᵀ [K, N_out] = Aᵀ [K, M] · dZ [M, N_out], where the row-major buffers are
/// the transposes as they stand.
template <storage_type T, class Out>
void gemm_linear_weight_grad(cudaStream_t stream, const T* a, const T* dz, Out* dw,
                             const linear_dims& d, bool accumulate, bool allow_tf32,
                             std::byte* workspace) {
  constexpr const char* what = "linear_weight_grad (cuBLAS)";
  const cublasHandle_t handle = bind_cublas(stream, workspace, what);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  constexpr cudaDataType_t type = cuda_data_type<T>;
  check_cublas(
      cublasGemmEx_64(handle, CUBLAS_OP_N, CUBLAS_OP_T, d.in_features, d.out_features, d.rows,
                      &alpha, a, type, d.in_features, dz, type, d.out_features, &beta, dw,
                      cuda_data_type<Out>, d.in_features, gemm_compute_type<T>(allow_tf32),
                      CUBLAS_GEMM_DEFAULT),
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
                             bool allow_tf32, std::byte* workspace) {
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
                   CUDA_R_32F, rows, outputs * rows, g.groups, gemm_compute_type<T>(allow_tf32),
                   CUBLAS_GEMM_DEFAULT),
               what);
}

}  // namespace dropit::detail::cuda
