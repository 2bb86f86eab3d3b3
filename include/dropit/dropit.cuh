#pragma once
/// @file
/// Umbrella header of the CUDA backend (needs nvcc): everything in dropit.hpp plus `cuda_backend`
/// (cuda.hpp, which describes its semantics) and the definitions of its operations. The public
/// entry points are the same as the CPU backend's expert API: the caller passes device-accessible
/// buffers and a workspace sized by the matching `*_workspace_bytes` query.
///
/// CUDA's cuda_fp16.h declares a global `half`: next to `using namespace dropit`, write
/// `dropit::half`.
///
/// CUDA errors (a rejected launch, an invalid pointer) throw `dropit::error` with the CUDA error's
/// name and description; errors of kernels that already ran surface at the caller's next CUDA
/// synchronisation, as usual.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "dropit.hpp"
#include "cuda.hpp"
#include "detail/cuda/backend_ops.cuh"
