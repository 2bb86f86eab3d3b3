// The CUDA backend's tests of the weight gradients (test_weight_grad.cu), compiled by the host
// compiler and run on the CPU emulation of the device (cuda_emulation.hpp) with the emulated
// cuBLAS (cublas_emulation.cpp); built without cuDNN, so the backend takes its im2col path.
#include "../test_weight_grad.cu"
