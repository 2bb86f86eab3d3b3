// The CUDA backend reached from code compiled by the host compiler, as the LibTorch adapters reach
// it: through cuda.hpp and the instances dropit::cuda_instances compiles with nvcc. For each
// storage type and selection, the device cache and its densified tensor equal the CPU backend's bit
// for bit.

#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cstring>
#include <dropit/cuda.hpp>
#include <vector>

namespace {

/// A device copy of `bytes` bytes, freed on scope exit.
struct device_bytes {
  void* data = nullptr;
  std::size_t size;
  explicit device_bytes(std::size_t n) : size(n) {
    REQUIRE(cudaMalloc(&data, n + 1) == cudaSuccess);
  }
  ~device_bytes() { cudaFree(data); }
  device_bytes(const device_bytes&) = delete;
  device_bytes& operator=(const device_bytes&) = delete;
  template <class T>
  std::vector<T> download() const {
    std::vector<T> host(size / sizeof(T));
    REQUIRE(cudaMemcpy(host.data(), data, size, cudaMemcpyDeviceToHost) == cudaSuccess);
    return host;
  }
  dropit::workspace span() { return {static_cast<std::byte*>(data), size}; }
};

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace

TEST_CASE_TEMPLATE("cuda from the host compiler: compress and densify equal the CPU backend", T,
                   float, dropit::half, dropit::bfloat16) {
  using namespace dropit;
  const shape s{6, 1000};
  std::vector<T> x(static_cast<std::size_t>(s.numel()));
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = T(static_cast<float>(static_cast<int>(i * 37 % 1001) - 500) / 7.0f);

  for (const auto selection :
       {selection_kind::chunked_min_k, selection_kind::min_k, selection_kind::random}) {
    CAPTURE(static_cast<int>(selection));
    policy_spec spec;
    spec.selection = selection;
    spec.chunk_size = 512;
    spec.seed = 3;
    const cache_layout layout = plan_cache(spec, s, element_type_of<T>);

    // The CPU backend's cache and dense tensor.
    const cpu_backend cpu{1};
    std::vector<T> cpu_values(static_cast<std::size_t>(layout.kept()));
    std::vector<unsigned char> cpu_positions(layout.position_bytes());
    std::vector<std::byte> cpu_scratch(compress_workspace_bytes<T>(cpu, layout));
    compress<T>(cpu, tensor_view<const T>{x.data(), s},
                cache_view<T>{layout, cpu_values.data(), cpu_positions.data()}, cpu_scratch);
    std::vector<T> cpu_dense(x.size());
    std::vector<std::byte> cpu_densify_scratch(densify_workspace_bytes<T>(cpu, layout));
    densify<T>(cpu, cache_view<const T>{layout, cpu_values.data(), cpu_positions.data()},
               tensor_view<T>{cpu_dense.data(), s}, cpu_densify_scratch);

    // The same on the GPU, through the declarations of cuda.hpp.
    const cuda_backend gpu{};
    device_bytes input(x.size() * sizeof(T)), values(layout.value_bytes()),
        positions(layout.position_bytes()), dense(x.size() * sizeof(T)),
        scratch(compress_workspace_bytes<T>(gpu, layout)),
        densify_scratch(densify_workspace_bytes<T>(gpu, layout));
    REQUIRE(cudaMemcpy(input.data, x.data(), input.size, cudaMemcpyHostToDevice) == cudaSuccess);
    compress<T>(gpu, tensor_view<const T>{static_cast<const T*>(input.data), s},
                cache_view<T>{layout, static_cast<T*>(values.data), positions.data},
                scratch.span());
    densify<T>(gpu, cache_view<const T>{layout, static_cast<const T*>(values.data), positions.data},
               tensor_view<T>{static_cast<T*>(dense.data), s}, densify_scratch.span());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);

    CHECK(same_bits(values.download<T>(), cpu_values));
    CHECK(same_bits(positions.download<unsigned char>(), cpu_positions));
    CHECK(same_bits(dense.download<T>(), cpu_dense));
  }
}
