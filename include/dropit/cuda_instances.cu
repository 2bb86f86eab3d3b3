/// @file
/// The CUDA backend's operations instantiated for every storage type, so that code compiled by a
/// host compiler can call them through `cuda.hpp`. Compile this file with nvcc once per program
/// (CMake: link `dropit::cuda_instances`, which adds it to the target's sources).

#include "dropit.cuh"

namespace dropit {

#define DROPIT_INSTANTIATE_CUDA_OPERATIONS(T)                                                      \
  template std::size_t compress_workspace_bytes<T>(const cuda_backend&, const cache_layout&);      \
  template void compress<T>(const cuda_backend&, tensor_view<const T>, cache_view<T>, workspace);  \
  template std::size_t densify_workspace_bytes<T>(const cuda_backend&, const cache_layout&);       \
  template void densify<T>(const cuda_backend&, cache_view<const T>, tensor_view<T>, workspace);   \
  template std::size_t linear_weight_grad_workspace_bytes<T>(                                      \
      const cuda_backend&, const cache_layout&, const shape&, const shape&);                       \
  template void linear_weight_grad<T>(const cuda_backend&, cache_view<const T>,                    \
                                      tensor_view<const T>, tensor_view<T>, grad_mode, workspace); \
  template std::size_t conv2d_weight_grad_workspace_bytes<T>(                                      \
      const cuda_backend&, const cache_layout&, const shape&, const shape&, const conv2d_params&); \
  template void conv2d_weight_grad<T>(const cuda_backend&, cache_view<const T>,                    \
                                      tensor_view<const T>, tensor_view<T>, const conv2d_params&,  \
                                      grad_mode, workspace);                                       \
  template void pack_relu_mask<T>(const cuda_backend&, tensor_view<const T>, std::uint32_t*);      \
  template void relu_with_mask<T>(const cuda_backend&, tensor_view<const T>, tensor_view<T>,       \
                                  std::uint32_t*);                                                 \
  template void apply_relu_mask<T>(const cuda_backend&, const std::uint32_t*,                      \
                                   tensor_view<const T>, tensor_view<T>);

DROPIT_INSTANTIATE_CUDA_OPERATIONS(float)
DROPIT_INSTANTIATE_CUDA_OPERATIONS(half)
DROPIT_INSTANTIATE_CUDA_OPERATIONS(bfloat16)

#undef DROPIT_INSTANTIATE_CUDA_OPERATIONS

}  // namespace dropit
