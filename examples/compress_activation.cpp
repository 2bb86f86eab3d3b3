// Compresses a real-sized activation with every policy, and reports the cache's size against the
// dense tensor and the error of the weight gradient computed from it against the dense gradient.
//
//   dropit_compress_activation [--gamma 0.9] [--rows 8192] [--features 1024] [--outputs 1024]
//
// The activation is the input of a linear layer of a transformer MLP (rows = batch x tokens) after
// a GELU-like nonlinearity; dZ is Gaussian. The dense gradient is dropit's own at gamma = 0, which
// the test suite checks against an independent dense implementation.

#include <dropit/dropit.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

struct options {
  double gamma = 0.9;
  std::int64_t rows = 8192, features = 1024, outputs = 1024;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--gamma") o.gamma = std::atof(value);
    else if (flag == "--rows") o.rows = std::atoll(value);
    else if (flag == "--features") o.features = std::atoll(value);
    else if (flag == "--outputs") o.outputs = std::atoll(value);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      std::exit(2);
    }
  }
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double relative_error(const std::vector<float>& value, const std::vector<float>& reference) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < value.size(); ++i) {
    diff += (double(value[i]) - reference[i]) * (double(value[i]) - reference[i]);
    norm += double(reference[i]) * reference[i];
  }
  return std::sqrt(diff / norm);
}

struct context {
  dropit::tensor_view<const float> input, dz;
  std::int64_t outputs;
  std::vector<float> dense_dw;
};

std::vector<float> weight_grad_from(const context& c, const dropit::cache<float>& cache) {
  std::vector<float> dw(static_cast<std::size_t>(c.outputs * c.input.shape[1]));
  dropit::linear_weight_grad<float>(dropit::cpu, cache.view(), c.dz,
                                    {dw.data(), {c.outputs, c.input.shape[1]}});
  return dw;
}

template <class Policy>
void report(const char* name, const Policy& policy, const context& c) {
  const auto start = std::chrono::steady_clock::now();
  const dropit::cache<float> cache = dropit::compress(dropit::cpu, policy, c.input);
  const double compress_ms = 1e3 * seconds_since(start);
  const auto grad_start = std::chrono::steady_clock::now();
  const std::vector<float> dw = weight_grad_from(c, cache);
  const double grad_ms = 1e3 * seconds_since(grad_start);
  const double dense_bytes = double(c.input.numel()) * sizeof(float);
  std::printf("%-24s %-13s %9.1f %8.1f%% %10.3f %10.1f %9.1f\n", name,
              std::string(dropit::name_of(cache.layout().encoding)).c_str(),
              cache.bytes() / 1048576.0, 100.0 * (1.0 - cache.bytes() / dense_bytes),
              relative_error(dw, c.dense_dw), compress_ms, grad_ms);
}

}  // namespace

int main(int argc, char** argv) try {
  const options o = parse(argc, argv);
  std::mt19937 rng(2023);
  std::normal_distribution<float> normal;
  std::vector<float> input(static_cast<std::size_t>(o.rows * o.features));
  std::vector<float> dz(static_cast<std::size_t>(o.rows * o.outputs));
  for (float& x : input) {  // GELU of a Gaussian pre-activation
    const float z = normal(rng);
    x = 0.5f * z * (1.0f + std::erf(z / std::sqrt(2.0f)));
  }
  for (float& g : dz) g = normal(rng);

  context c{{input.data(), {o.rows, o.features}}, {dz.data(), {o.rows, o.outputs}}, o.outputs, {}};
  using namespace dropit;
  c.dense_dw = weight_grad_from(c, compress(cpu, policy<chunked_min_k_selection>{{0.0}}, c.input));

  std::printf("linear input [%lld, %lld] float32: %.1f MiB dense; dW [%lld, %lld]; gamma = %.2f; "
              "%d CPU threads\n\n",
              static_cast<long long>(o.rows), static_cast<long long>(o.features),
              double(c.input.numel()) * 4 / 1048576.0, static_cast<long long>(o.outputs),
              static_cast<long long>(o.features), o.gamma, cpu.thread_count());
  std::printf("%-24s %-13s %9s %9s %10s %10s %9s\n", "policy", "encoding", "cache MiB", "saved",
              "dW rel.err", "compress ms", "dW ms");
  report("chunked min-k (D=2^14)", policy<chunked_min_k_selection>{{o.gamma}}, c);
  report("min-k (whole tensor)", policy<min_k_selection>{{o.gamma}}, c);
  report("random", policy<random_selection>{{o.gamma, 42}}, c);
  report("min-k, channel", policy<min_k_selection, channel_granularity>{{o.gamma}, {-1}}, c);
  report("random, channel", policy<random_selection, channel_granularity>{{o.gamma, 42}, {-1}},
         c);
  std::printf("\ndW rel.err is ||dW - dW_dense|| / ||dW_dense||: the price of dropping; the paper "
              "finds min-k at gamma 0.9 trains to dense accuracy.\n");
  return 0;
} catch (const dropit::error& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
