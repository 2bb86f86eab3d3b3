#pragma once
// The CPU backend's hot loops are written once, as plain C++ (and, for the weight gradients, GCC
// and Clang vector types). On x86-64 each is compiled three times: as the build targets, for
// AVX2+FMA, and for AVX-512; the widest the processor has is chosen at run time. Users who compile
// dropit without -march flags thus still get the vector units, as an optimised BLAS does.
//
// DROPIT_CPU_ISA=generic|avx2|avx512 in the environment caps the choice (read once), so that the
// test suite can run every variant against the same references on one machine.

#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>

#if defined(__GNUC__) && defined(__x86_64__)
#define DROPIT_CPU_DISPATCH_X86 1
#else
#define DROPIT_CPU_DISPATCH_X86 0
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

/// Instruction sets the hot loops are compiled for, narrowest first.
enum class cpu_isa { generic, avx2, avx512 };

inline const char* name_of(cpu_isa isa) {
  switch (isa) {
    case cpu_isa::avx2:
      return "avx2";
    case cpu_isa::avx512:
      return "avx512";
    default:
      return "generic";
  }
}

/// The widest variant this processor runs, capped by DROPIT_CPU_ISA (an unknown value is ignored
/// rather than fatal: it only ever narrows the choice).
inline cpu_isa detect_cpu_isa() {
  cpu_isa isa = cpu_isa::generic;
#if DROPIT_CPU_DISPATCH_X86
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) isa = cpu_isa::avx2;
  if (isa == cpu_isa::avx2 && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    isa = cpu_isa::avx512;
#endif
  if (const char* cap = std::getenv("DROPIT_CPU_ISA")) {
    const std::string_view value(cap);
    if (value == "generic") isa = cpu_isa::generic;
    if (value == "avx2" && isa == cpu_isa::avx512) isa = cpu_isa::avx2;
  }
  return isa;
}

/// The variant every dispatched loop runs in this process.
inline cpu_isa active_cpu_isa() {
  static const cpu_isa isa = detect_cpu_isa();
  return isa;
}

}  // namespace dropit::detail::cpu

/// Defines `name(args...)`, which runs `name##_kernel(args...)` compiled for the widest
/// instruction set `active_cpu_isa()` allows. `flatten` inlines everything the kernel calls into
/// each variant, so the whole loop nest (selection, visitors) is compiled for that target.
#if DROPIT_CPU_DISPATCH_X86
#define DROPIT_CPU_DISPATCH(name)                                                               \
  template <class... Args>                                                                      \
  [[gnu::target("avx2,fma"), gnu::flatten]] decltype(auto) name##_avx2(Args&&... args) {        \
    return name##_kernel(std::forward<Args>(args)...);                                          \
  }                                                                                             \
  template <class... Args>                                                                      \
  [[gnu::target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"), gnu::flatten]] decltype(auto)   \
      name##_avx512(Args&&... args) {                                                           \
    return name##_kernel(std::forward<Args>(args)...);                                          \
  }                                                                                             \
  template <class... Args>                                                                      \
  decltype(auto) name(Args&&... args) {                                                         \
    switch (::dropit::detail::cpu::active_cpu_isa()) {                                          \
      case ::dropit::detail::cpu::cpu_isa::avx512:                                              \
        return name##_avx512(std::forward<Args>(args)...);                                      \
      case ::dropit::detail::cpu::cpu_isa::avx2:                                                \
        return name##_avx2(std::forward<Args>(args)...);                                        \
      default:                                                                                  \
        return name##_kernel(std::forward<Args>(args)...);                                      \
    }                                                                                           \
  }
#else
#define DROPIT_CPU_DISPATCH(name)                     \
  template <class... Args>                            \
  decltype(auto) name(Args&&... args) {               \
    return name##_kernel(std::forward<Args>(args)...); \
  }
#endif
