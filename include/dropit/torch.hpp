#pragma once
/// @file
/// LibTorch adapters (namespace dropit::torch): drop-in Linear, Conv2d and 1-bit ReLU layers,
/// `convert` for existing models, activation checkpointing, and allocator-level memory
/// measurement. Include explicitly; the
/// core umbrella `dropit.hpp` does not pull in LibTorch. Like <torch/torch.h>, which it includes,
/// it brings LibTorch's whole C++ frontend (optimisers, data loaders); the headers under
/// dropit/torch/ include only the parts of LibTorch they use.

#include <torch/torch.h>

#include "dropit.hpp"
#include "torch/attention.hpp"
#include "torch/checkpoint.hpp"
#include "torch/compat.hpp"
#include "torch/convert.hpp"
#include "torch/functions.hpp"
#include "torch/memory.hpp"
#include "torch/modules.hpp"
#include "torch/plan.hpp"
#include "torch/tensor.hpp"
