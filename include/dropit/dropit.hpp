#pragma once
/// @file
/// Umbrella header: everything that compiles without nvcc (policies, cache, CPU backend).

#include "backend.hpp"
#include "cache.hpp"
#include "compress.hpp"
#include "config.hpp"
#include "policy.hpp"
#include "relu_mask.hpp"
#include "shape.hpp"
#include "types.hpp"
#include "weight_grad.hpp"
