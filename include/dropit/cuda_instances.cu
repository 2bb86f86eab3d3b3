/// @file
/// The CUDA backend's operations instantiated for every storage type, so that code compiled by a
/// host compiler can call them through `cuda.hpp`. Compile this file with nvcc once per program
/// (CMake: link `dropit::cuda_instances`, which adds it to the target's sources).

#include "dropit.cuh"

namespace dropit::detail {

#define DROPIT_INSTANTIATE_CUDA_OPERATIONS(T)                                                     \
  template std::size_t backend_ops<cuda_backend>::compress_workspace_bytes<T>(                    \
      const cuda_backend&, const cache_layout&, const std::optional<channels_last_dims>&);        \
  template void backend_ops<cuda_backend>::compress<T>(                                           \
      const cuda_backend&, const T*, const std::optional<channels_last_dims>&,                    \
      const cache_view<T>&, workspace);                                                           \
  template std::size_t backend_ops<cuda_backend>::densify_workspace_bytes<T>(                     \
      const cuda_backend&, const cache_layout&);                                                  \
  template void backend_ops<cuda_backend>::densify<T>(const cuda_backend&,                        \
                                                      const cache_view<const T>&, T*, workspace); \
  template std::size_t backend_ops<cuda_backend>::linear_weight_grad_workspace_bytes<T>(          \
      const cuda_backend&, const cache_layout&, const linear_dims&);                              \
  template void backend_ops<cuda_backend>::linear_weight_grad<T>(                                 \
      const cuda_backend&, const cache_view<const T>&, const T*, T*, const linear_dims&,          \
      grad_mode, workspace);                                                                      \
  template std::size_t backend_ops<cuda_backend>::conv2d_weight_grad_workspace_bytes<T>(          \
      const cuda_backend&, const cache_layout&, const conv2d_geometry&);                          \
  template void backend_ops<cuda_backend>::conv2d_weight_grad<T>(                                 \
      const cuda_backend&, const cache_view<const T>&, const T*, T*, const conv2d_geometry&,      \
      grad_mode, workspace);                                                                      \
  template void backend_ops<cuda_backend>::pack_relu_mask<T>(const cuda_backend&, const T*, T*,   \
                                                             std::int64_t, std::uint32_t*);       \
  template void backend_ops<cuda_backend>::apply_relu_mask<T>(                                    \
      const cuda_backend&, const std::uint32_t*, const T*, T*, std::int64_t);                     \
  template void backend_ops<cuda_backend>::pack_relu_mask_channels_last<T>(                       \
      const cuda_backend&, const T*, T*, const channels_last_dims&, std::uint32_t*);              \
  template void backend_ops<cuda_backend>::apply_relu_mask_channels_last<T>(                      \
      const cuda_backend&, const std::uint32_t*, const T*, T*, const channels_last_dims&);

DROPIT_INSTANTIATE_CUDA_OPERATIONS(float)
DROPIT_INSTANTIATE_CUDA_OPERATIONS(half)
DROPIT_INSTANTIATE_CUDA_OPERATIONS(bfloat16)

#undef DROPIT_INSTANTIATE_CUDA_OPERATIONS

}  // namespace dropit::detail
