#pragma once
// The context every dropit benchmark binary records in its JSON output (Google Benchmark's
// "context"), so that a result file says what machine, threads and build produced it. The report
// writers print it above their tables.

#include <benchmark/benchmark.h>

#include <dropit/dropit.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace bench {

/// The processor's model name from /proc/cpuinfo ("unknown" elsewhere).
inline std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "unknown";
}

/// Records the machine (cpu_model, the dropit CPU kernels chosen at run time), the thread count
/// and how it was applied (`threading`), dropit's version, the compiler, the build and the OpenMP
/// wait policy. libgomp's default policy spins after every parallel region, on the cores OpenBLAS
/// needs next; when the caller's run script did not set it, a warning says what that slows
/// (`spinning_slows`).
inline void add_common_context(int threads, const std::string& threading,
                               const char* spinning_slows) {
  benchmark::AddCustomContext("cpu_model", cpu_model());
  benchmark::AddCustomContext("cpu_isa",
                              dropit::detail::cpu::name_of(dropit::detail::cpu::active_cpu_isa()));
  benchmark::AddCustomContext("threads", std::to_string(threads));
  benchmark::AddCustomContext("threading", threading);
  benchmark::AddCustomContext("dropit_version", std::to_string(DROPIT_VERSION_MAJOR) + "." +
                                                    std::to_string(DROPIT_VERSION_MINOR) + "." +
                                                    std::to_string(DROPIT_VERSION_PATCH));
#if defined(__VERSION__)
  benchmark::AddCustomContext("compiler", __VERSION__);
#endif
#if defined(DROPIT_BENCH_BUILD_TYPE)
  benchmark::AddCustomContext("build", std::string(DROPIT_BENCH_BUILD_TYPE) + ", -O3" +
                                           (DROPIT_BENCH_NATIVE ? " -march=native" : ""));
#endif
  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
  benchmark::AddCustomContext("omp_wait_policy", wait_policy ? wait_policy : "unset");
  if (wait_policy == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr)
    std::fprintf(stderr,
                 "warning: OMP_WAIT_POLICY is unset; spinning OpenMP threads slow %s. The "
                 "benchmarks' run.sh sets OMP_WAIT_POLICY=passive.\n",
                 spinning_slows);
}

}  // namespace bench
