// The CUDA backend's tests of compress, densify and the ReLU mask (test_cache.cu), compiled by the
// host compiler and run on the CPU emulation of the device (cuda_emulation.hpp).
#include "../test_cache.cu"
