#pragma once
// The CPU backend's hot loops are written once, as always-inline kernels over GCC/Clang vector
// types. On x86-64 builds without AVX2 (the default target) each is also compiled for AVX2+FMA and
// chosen at run time, so that users who compile dropit without -march flags still get the vector
// units, as an optimised BLAS does.

#include <cstring>

#if defined(__GNUC__) && defined(__x86_64__) && !(defined(__AVX2__) && defined(__FMA__))
#define DROPIT_CPU_DISPATCH_AVX2 1
#else
#define DROPIT_CPU_DISPATCH_AVX2 0
#endif

#if defined(__GNUC__)
#define DROPIT_ALWAYS_INLINE [[gnu::always_inline]] inline
#else
#define DROPIT_ALWAYS_INLINE inline
#endif

namespace dropit::detail::cpu {

#if defined(__GNUC__)
/// Eight floats as one value: GCC and Clang keep arrays of these in vector registers, where a plain
/// float array of the same size would be spilled to the stack. Only used inside function bodies,
/// so no ABI depends on the target's vector width.
using float8 = float __attribute__((vector_size(32)));

DROPIT_ALWAYS_INLINE void load(float8& v, const float* p) { std::memcpy(&v, p, sizeof v); }
DROPIT_ALWAYS_INLINE void store(float* p, const float8& v) { std::memcpy(p, &v, sizeof v); }
#endif

#if DROPIT_CPU_DISPATCH_AVX2
inline bool cpu_has_avx2_fma() {
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported;
}
#endif

}  // namespace dropit::detail::cpu

/// Defines `name(args...)`, which runs `name##_kernel` compiled for AVX2+FMA when the processor
/// has them and the build target lacks them, and as compiled otherwise.
#if DROPIT_CPU_DISPATCH_AVX2
#define DROPIT_CPU_DISPATCH(name)                                                        \
  template <class... Args>                                                               \
  [[gnu::target("avx2,fma")]] void name##_avx2(Args... args) {                           \
    name##_kernel(args...);                                                              \
  }                                                                                      \
  template <class... Args>                                                               \
  void name(Args... args) {                                                              \
    if (::dropit::detail::cpu::cpu_has_avx2_fma()) return name##_avx2<Args...>(args...); \
    name##_kernel(args...);                                                              \
  }
#else
#define DROPIT_CPU_DISPATCH(name) \
  template <class... Args>        \
  void name(Args... args) {       \
    name##_kernel(args...);       \
  }
#endif
