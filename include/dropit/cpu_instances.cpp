/// @file
/// The CPU backend's operations instantiated for every storage type. A program whose translation
/// units all define DROPIT_CPU_INSTANCES compiles this file once (CMake: link
/// `dropit::cpu_instances`) and its other translation units no longer compile the CPU loops.

#include "dropit.hpp"

namespace dropit::detail {

DROPIT_CPU_OPERATIONS(template, float)
DROPIT_CPU_OPERATIONS(template, half)
DROPIT_CPU_OPERATIONS(template, bfloat16)

}  // namespace dropit::detail
