/// @file
/// The CUDA backend's operations instantiated for every storage type, so that code compiled by a
/// host compiler can call them through `cuda.hpp`. Compile this file with nvcc once per program
/// (CMake: link `dropit::cuda_instances`, which adds it to the target's sources); a program whose
/// nvcc translation units define DROPIT_CUDA_INSTANCES no longer compiles the kernels in each of
/// them.

#include "dropit.cuh"

namespace dropit::detail {

DROPIT_CUDA_OPERATIONS(template, float)
DROPIT_CUDA_OPERATIONS(template, half)
DROPIT_CUDA_OPERATIONS(template, bfloat16)

}  // namespace dropit::detail
