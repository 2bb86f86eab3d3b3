// The cuBLAS functions the CUDA backend calls, for the emulated device (see cuda_emulation.hpp):
// a handle holds its stream (the workspace and math mode are only checked), and a GEMM is computed
// on the host by the
// definition cuBLAS documents — column-major operands, C = alpha op(A) op(B) + beta C, C not read
// where beta is 0 — with products summed in float in k order (the 32-bit compute types; for TF32
// the inputs rounded to 10 bits of mantissa, to nearest, a model of the tensor cores' rounding),
// after the argument checks cuBLAS documents (sizes, leading dimensions, type combinations) and
// checks of what it leaves undefined: every operand within one allocation of device memory, A and
// B not overlapping C, the batches of C not overlapping one another. So the backend's calls
// (operations, leading dimensions, batch strides) are checked against the weight gradient's
// reference; cuBLAS's kernels and their summation order are not emulated.

#include "cuda_emulation.hpp"

#include <cublas_v2.h>
#include <dropit/types.hpp>  // half and bfloat16 operands, converted as the library converts them

#include <bit>
#include <cstdint>

/// What a handle holds that the backend reads back: its stream.
struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace {

float tf32_of_float(float value) {  // round to nearest even, 10 bits of mantissa
  const auto bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7f800000u) == 0x7f800000u) return value;
  return std::bit_cast<float>((bits + 0xfffu + ((bits >> 13) & 1u)) & ~0x1fffu);
}

/// Element `index` of an array of `type`, as float.
float load(const void* array, cudaDataType type, std::int64_t index) {
  switch (type) {
    case CUDA_R_32F:
      return static_cast<const float*>(array)[index];
    case CUDA_R_16F:
      return dropit::to_float(static_cast<const dropit::half*>(array)[index]);
    default:  // CUDA_R_16BF
      return dropit::to_float(static_cast<const dropit::bfloat16*>(array)[index]);
  }
}

void store(void* array, cudaDataType type, std::int64_t index, float value) {
  switch (type) {
    case CUDA_R_32F:
      static_cast<float*>(array)[index] = value;
      break;
    case CUDA_R_16F:
      static_cast<dropit::half*>(array)[index] = dropit::from_float<dropit::half>(value);
      break;
    default:  // CUDA_R_16BF
      static_cast<dropit::bfloat16*>(array)[index] = dropit::from_float<dropit::bfloat16>(value);
  }
}

std::size_t bytes_of(cudaDataType type) { return type == CUDA_R_32F ? 4 : 2; }

/// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto a_start = reinterpret_cast<std::uintptr_t>(a);
  const auto b_start = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes != 0 && b_bytes != 0 && a_start < b_start + b_bytes && b_start < a_start + a_bytes;
}

/// The elements a column-major `rows` x `columns` operand with leading dimension `ld` spans.
std::int64_t span_of(std::int64_t rows, std::int64_t columns, std::int64_t ld) {
  return rows == 0 || columns == 0 ? 0 : (columns - 1) * ld + rows;
}

bool supported(cudaDataType ab, cudaDataType c, cublasComputeType_t compute) {
  if (compute == CUBLAS_COMPUTE_32F_FAST_TF32) return ab == CUDA_R_32F && c == CUDA_R_32F;
  if (compute != CUBLAS_COMPUTE_32F) return false;
  return (ab == CUDA_R_32F && c == CUDA_R_32F) ||
         ((ab == CUDA_R_16F || ab == CUDA_R_16BF) && (c == ab || c == CUDA_R_32F));
}

/// `batches` GEMMs, operand b of batch i at b's pointer + i * its stride (in elements).
cublasStatus_t gemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                    std::int64_t m, std::int64_t n, std::int64_t k, const void* alpha,
                    const void* a, cudaDataType a_type, std::int64_t lda, std::int64_t stride_a,
                    const void* b, cudaDataType b_type, std::int64_t ldb, std::int64_t stride_b,
                    const void* beta, void* c, cudaDataType c_type, std::int64_t ldc,
                    std::int64_t stride_c, std::int64_t batches, cublasComputeType_t compute) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  // Real types: the conjugate transpose is the transpose.
  const auto transposed = [](cublasOperation_t op) {
    return op == CUBLAS_OP_T || op == CUBLAS_OP_C;
  };
  const bool a_transposed = transposed(transa), b_transposed = transposed(transb);
  if ((transa != CUBLAS_OP_N && !a_transposed) || (transb != CUBLAS_OP_N && !b_transposed))
    return CUBLAS_STATUS_INVALID_VALUE;
  // Stored shapes: A is m x k (k x m transposed), B k x n (n x k), C m x n.
  const std::int64_t a_rows = a_transposed ? k : m, a_columns = a_transposed ? m : k;
  const std::int64_t b_rows = b_transposed ? n : k, b_columns = b_transposed ? k : n;
  if (m < 0 || n < 0 || k < 0 || batches < 0 || lda < std::max<std::int64_t>(1, a_rows) ||
      ldb < std::max<std::int64_t>(1, b_rows) || ldc < std::max<std::int64_t>(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (a_type != b_type || !supported(a_type, c_type, compute)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (stride_a < 0 || stride_b < 0 || stride_c < 0) return CUBLAS_STATUS_NOT_SUPPORTED;  // here
  if (m == 0 || n == 0 || batches == 0) return CUBLAS_STATUS_SUCCESS;
  // The bytes a batched operand spans.
  const auto extent = [&](std::int64_t span, std::int64_t stride, cudaDataType type) {
    return span == 0 ? 0 : static_cast<std::size_t>((batches - 1) * stride + span) * bytes_of(type);
  };
  const std::size_t a_bytes = extent(span_of(a_rows, a_columns, lda), stride_a, a_type);
  const std::size_t b_bytes = extent(span_of(b_rows, b_columns, ldb), stride_b, b_type);
  const std::size_t c_bytes = extent(span_of(m, n, ldc), stride_c, c_type);
  using dropit_emulation::in_one_allocation;
  if (!in_one_allocation(a, a_bytes) || !in_one_allocation(b, b_bytes) ||
      !in_one_allocation(c, c_bytes))
    return CUBLAS_STATUS_EXECUTION_FAILED;  // the device would fault, or read another buffer
  // Undefined in cuBLAS: an output that is also an input, batches writing the same elements.
  if (overlap(a, a_bytes, c, c_bytes) || overlap(b, b_bytes, c, c_bytes) ||
      (batches > 1 && stride_c < span_of(m, n, ldc)))
    return CUBLAS_STATUS_INVALID_VALUE;
  const float alpha_value = *static_cast<const float*>(alpha);
  const float beta_value = *static_cast<const float*>(beta);
  const bool tf32 = compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  const auto operand = [&](const void* x, cudaDataType type, std::int64_t index) {
    const float value = load(x, type, index);
    return tf32 ? tf32_of_float(value) : value;
  };
  for (std::int64_t batch = 0; batch < batches; ++batch)
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < m; ++i) {
        float sum = 0.0f;
        for (std::int64_t p = 0; p < k; ++p) {
          const std::int64_t a_index = a_transposed ? p + i * lda : i + p * lda;
          const std::int64_t b_index = b_transposed ? j + p * ldb : p + j * ldb;
          sum += operand(a, a_type, batch * stride_a + a_index) *
                 operand(b, b_type, batch * stride_b + b_index);
        }
        const std::int64_t c_index = batch * stride_c + i + j * ldc;
        const float old = beta_value == 0.0f ? 0.0f : beta_value * load(c, c_type, c_index);
        store(c, c_type, c_index, alpha_value * sum + old);
      }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  *handle = new cublasContext{};  // never destroyed, as the backend's handles
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t) {
  return handle == nullptr ? CUBLAS_STATUS_NOT_INITIALIZED : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  *stream = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t bytes) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  // cuBLAS requires a workspace aligned to 256 bytes, in device memory.
  if (reinterpret_cast<std::uintptr_t>(workspace) % 256 != 0) return CUBLAS_STATUS_INVALID_VALUE;
  return dropit_emulation::in_one_allocation(workspace, bytes) ? CUBLAS_STATUS_SUCCESS
                                                               : CUBLAS_STATUS_INVALID_VALUE;
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    default:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
  }
}
const char* cublasGetStatusString(cublasStatus_t status) { return cublasGetStatusName(status); }

cublasStatus_t cublasGemmEx_64(cublasHandle_t handle, cublasOperation_t transa,
                               cublasOperation_t transb, int64_t m, int64_t n, int64_t k,
                               const void* alpha, const void* a, cudaDataType a_type, int64_t lda,
                               const void* b, cudaDataType b_type, int64_t ldb, const void* beta,
                               void* c, cudaDataType c_type, int64_t ldc,
                               cublasComputeType_t compute, cublasGemmAlgo_t) {
  return gemm(handle, transa, transb, m, n, k, alpha, a, a_type, lda, 0, b, b_type, ldb, 0, beta, c,
              c_type, ldc, 0, 1, compute);
}

cublasStatus_t cublasGemmStridedBatchedEx_64(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int64_t m, int64_t n,
    int64_t k, const void* alpha, const void* a, cudaDataType a_type, int64_t lda,
    long long stride_a, const void* b, cudaDataType b_type, int64_t ldb, long long stride_b,
    const void* beta, void* c, cudaDataType c_type, int64_t ldc, long long stride_c,
    int64_t batches, cublasComputeType_t compute, cublasGemmAlgo_t) {
  return gemm(handle, transa, transb, m, n, k, alpha, a, a_type, lda, stride_a, b, b_type, ldb,
              stride_b, beta, c, c_type, ldc, stride_c, batches, compute);
}

}  // extern "C"
