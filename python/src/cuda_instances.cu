// The CUDA backend's instances (include/dropit/cuda_instances.cu), compiled by nvcc into the
// extension when it is built with CUDA.
#include <dropit/cuda_instances.cu>
