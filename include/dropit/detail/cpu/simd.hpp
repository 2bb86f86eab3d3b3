#pragma once
// The CPU backend's hot loops are written once, as plain C++ (and, for the weight gradients, GCC
// and Clang vector types). On x86-64 each is compiled three times: as the build targets, for
// AVX2+FMA, and for AVX-512; the widest the processor has is chosen at run time. Users who compile
// dropit without -march flags thus still get the vector units, as an optimised BLAS does.
//
// DROPIT_CPU_ISA=generic|avx2|avx512 in the environment caps the choice (read once), so that the
// test suite can run every variant against the same references on one machine.

#include <bit>
#include <cstdint>
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

/// Eight 32-bit keys; comparing them with a scalar gives a lane mask (all ones where true).
using key8 = std::uint32_t __attribute__((vector_size(32)));
#endif

/// Bit j of the result says whether `lower <= keys[j] <= lower + span`, for the 32 keys from
/// `keys`. Subtracting `lower` wraps the keys below the range past every key in it, so one unsigned
/// comparison tests both ends.
DROPIT_ALWAYS_INLINE std::uint32_t word_mask(const std::uint32_t* keys, std::uint32_t lower,
                                             std::uint32_t span) {
#if defined(__GNUC__)
  const key8 lane_bits = {1u, 2u, 4u, 8u, 16u, 32u, 64u, 128u};
  key8 bits = {};
  for (int group = 0; group < 4; ++group) {
    key8 group_keys;
    std::memcpy(&group_keys, keys + 8 * group, sizeof group_keys);
    bits |= reinterpret_cast<key8>(group_keys - lower <= span) & (lane_bits << (8 * group));
  }
  // OR the eight lanes together as a tree: halves, then quarters, then pairs.
  bits |= __builtin_shufflevector(bits, bits, 4, 5, 6, 7, 0, 1, 2, 3);
  bits |= __builtin_shufflevector(bits, bits, 2, 3, 0, 1, 6, 7, 4, 5);
  bits |= __builtin_shufflevector(bits, bits, 1, 0, 3, 2, 5, 4, 7, 6);
  return bits[0];
#else
  std::uint32_t mask = 0;
  for (int j = 0; j < 32; ++j) mask |= static_cast<std::uint32_t>(keys[j] - lower <= span) << j;
  return mask;
#endif
}

/// The set bits of each 8-bit mask as a list of lane numbers, padded to 8 entries.
struct set_lane_table {
  std::uint32_t lanes[256][8];
};

inline constexpr set_lane_table set_lanes = [] {
  set_lane_table table{};
  for (int mask = 0; mask < 256; ++mask)
    for (int lane = 0, count = 0; lane < 8; ++lane)
      if ((mask >> lane) & 1) table.lanes[mask][count++] = static_cast<std::uint32_t>(lane);
  return table;
}();

/// Writes `first + j` for each set bit j of `mask`, ascending, to `out` and returns how many.
/// Branch-free: the eight lanes of each byte are looked up and stored whole, so it may write past
/// the result, but never past `out + 32`.
DROPIT_ALWAYS_INLINE std::int64_t append_set_bits(std::uint32_t mask, std::uint32_t first,
                                                  std::uint32_t* out) {
  std::int64_t count = 0;
  for (int group = 0; group < 4; ++group) {
    const std::uint32_t byte = (mask >> (8 * group)) & 0xffu;
    const std::uint32_t base = first + 8 * static_cast<std::uint32_t>(group);
    const std::uint32_t* lanes = set_lanes.lanes[byte];
    for (int lane = 0; lane < 8; ++lane) out[count + lane] = base + lanes[lane];
    count += std::popcount(byte);
  }
  return count;
}

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
