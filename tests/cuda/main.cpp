// doctest's main for the CUDA tests. Without a usable CUDA device nothing can run: the executable
// says so and exits with 77, which ctest (SKIP_RETURN_CODE) reports as skipped rather than passed.
// `--deviceless` runs only the test suite "deviceless" (what needs the CUDA libraries but no
// device), on any machine.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[argc - 1], "--deviceless") == 0) {
    doctest::Context context(argc - 1, argv);
    context.addFilter("test-suite", "deviceless");
    return context.run();
  }
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: CUDA tests skipped (%s)\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "no device found");
    return 77;
  }
  // On stderr: doctest's test list (stdout), which ctest's discovery reads, stays only names.
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, 0) == cudaSuccess)
    std::fprintf(stderr, "CUDA device 0: %s (sm_%d%d)\n", properties.name, properties.major,
                 properties.minor);
  doctest::Context context(argc, argv);
  return context.run();
}
