// CPU/GPU parity of compress and densify: for every policy, element type, drop rate and a range of
// shapes (chunk tails, tensors over 2^16 elements, more candidates than one span of the multi-block
// selection, many channels), the GPU cache must hold the CPU cache's values and encoded positions
// bit for bit, and densify must agree bit for bit, on GPU-made and CPU-made caches alike. Also the
// ReLU mask, the caller's stream, and bad inputs.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "cuda_helpers.cuh"

namespace {

using cuda_test::device_buffer;
using dropit::bfloat16;
using dropit::half;
using namespace dropit;

const cpu_backend serial{1};

struct shape_case {
  std::vector<std::int64_t> dims;
  int channel_axis;
};

const shape_case shape_cases[] = {
    {{1}, 0},      {{7}, 0},    {{33}, 0}, {{100, 3}, 1}, {{2, 3, 5, 7}, 1}, {{3, 64, 9}, 1},
    {{4, 33}, -1}, {{5000}, 0}, {{0}, 0},  {{4, 0}, 1},   {{0, 6}, 1},
};

// Bigger shapes: default chunks with a tail, min-k with 32-bit offsets and several spans of the
// multi-block selection, channels spread over several spans, channels scored over several runs.
const shape_case large_cases[] = {
    {{3 * 16384 + 77}, 0}, {{7, 10001}, 1}, {{2, 40000}, 1}, {{3, 5, 1000}, 1}};

// On the CPU emulation of the device the cases over many large tensors would take minutes each:
// there one is skipped (doctest then neither lists nor runs it, so ctest has no test for it),
// another runs on a subset.
using cuda_test::emulated_device;

// The GPU run of `p` on x must reproduce the CPU run bit for bit.
template <class T, class P>
void check_parity(const std::vector<T>& x, const dropit::shape& s, const P& p,
                  const cuda_backend& gpu) {
  const auto want = compress(serial, p, test::view_of(x, s));
  const device_buffer<T> input(x);
  const auto got = cuda_test::gpu_compress<T>(gpu, want.layout(), input);
  CHECK_BITS_EQUAL(got.values.download(), test::values_of(want));
  CHECK(got.position_bytes() == test::position_bytes(want));

  const auto dense = densify(serial, want);
  CHECK_BITS_EQUAL(cuda_test::gpu_densify(gpu, got), dense);
  CHECK_BITS_EQUAL(cuda_test::gpu_densify(gpu, cuda_test::upload(want)), dense);
}

template <class T, class F>
void for_each_case(const shape_case* begin, const shape_case* end, F&& f) {
  std::uint64_t seed = 11;
  for (const shape_case* c = begin; c != end; ++c)
    for (double gamma : {0.0, 0.29, 0.5, 0.9, 0.99})
      for (bool nasty : {true, false}) {
        const dropit::shape s = test::shape_of(c->dims);
        const std::int64_t n = s.numel();
        const auto x = nasty ? test::nasty_values<T>(n, seed++) : test::smooth_values<T>(n, seed++);
        test::for_each_policy(gamma, c->channel_axis, [&](const auto& p, const char* name) {
          CAPTURE(s);
          CAPTURE(gamma);
          CAPTURE(nasty);
          CAPTURE(name);
          f(x, s, p);
        });
      }
}

}  // namespace

TEST_CASE_TEMPLATE("cuda: compress and densify match the CPU backend bit for bit", T, float,
                   dropit::half, bfloat16) {
  const cuda_backend gpu{};
  for_each_case<T>(
      std::begin(shape_cases), std::end(shape_cases),
      [&](const auto& x, const auto& s, const auto& p) { check_parity(x, s, p, gpu); });
}

TEST_CASE_TEMPLATE("cuda: large tensors, many channels and spans" * doctest::skip(emulated_device),
                   T, float, dropit::half, dropit::bfloat16) {
  const cuda_backend gpu{};
  for_each_case<T>(
      std::begin(large_cases), std::end(large_cases),
      [&](const auto& x, const auto& s, const auto& p) { check_parity(x, s, p, gpu); });
}

TEST_CASE_TEMPLATE("cuda: chunk sizes from 1 to 2^16, ties everywhere", T, float, dropit::half,
                   dropit::bfloat16) {
  const cuda_backend gpu{};
  const std::int64_t n = 3 * 65536 + 1000;
  using S = test::special<T>;
  // A quarter NaNs of every payload, both signs, quiet and signalling, among the nasty values:
  // every NaN is one key, whatever its bits, where the selection compares keys unclamped.
  std::vector<T> payload_nans = test::nasty_values<T>(n, 6);
  std::mt19937_64 rng(7);
  for (auto& v : payload_nans) {
    const std::uint32_t sign = (rng() & 1) ? S::sign : 0u;
    if (rng() % 4 == 0)
      v = test::from_bits<T>(sign | S::inf |
                             (1u + static_cast<std::uint32_t>(rng() % S::subnormal_mask)));
  }
  std::vector<std::vector<T>> inputs;
  inputs.push_back(test::nasty_values<T>(n, 5));
  inputs.push_back(std::vector<T>(n, test::make<T>(1.0)));  // one big tie
  inputs.push_back(payload_nans);
  inputs.push_back(std::vector<T>(n, T{}));  // all +0
  std::vector<T> nans(n, test::from_bits<T>(S::quiet_nan));
  for (std::int64_t i = 0; i < n; i += 3) nans[i] = test::from_bits<T>(S::inf);
  inputs.push_back(nans);
  std::vector<std::int64_t> sizes = {1, 2, 31, 32, 33, 1000, 16384, 65535, 65536};
  std::vector<double> gammas = {0.0, 0.5, 0.9, 0.999};
  if (emulated_device) {
    // There each size takes minutes: the longest chunks (float32's 2^16 is too long to stage, so
    // only this case runs the kernel that reads a chunk from global memory in every pass) and a
    // short one, three inputs, two drop rates; the whole-tensor selections below are left out.
    sizes = {1000, 65536};
    gammas = {0.5, 0.999};
    inputs.resize(3);
  }
  for (const auto& x : inputs)
    for (std::int64_t d : sizes)
      for (double gamma : gammas) {
        CAPTURE(d);
        CAPTURE(gamma);
        check_parity(x, {n}, policy<chunked_min_k_selection>{{gamma, d}}, gpu);
        check_parity(x, {n}, policy<random_selection>{{.gamma = gamma, .seed = 3, .chunk_size = d}},
                     gpu);
        check_parity(
            x, {n},
            policy<random_selection>{{.gamma = gamma, .seed = 4, .chunk_size = d, .rescale = true}},
            gpu);
      }
  if (emulated_device) return;
  for (const auto& x : inputs)
    for (double gamma : gammas) {
      CAPTURE(gamma);
      check_parity(x, {n}, policy<min_k_selection>{{gamma}}, gpu);
      const std::vector<T> head(x.begin(), x.begin() + 197 * 1000);  // 197 equal-score channels
      check_parity(head, {1000, 197}, policy<min_k_selection, channel_granularity>{{gamma}, {1}},
                   gpu);
    }
}

// The kept ties end exactly where one of the emit's 128-candidate groups ends (and, with 2048,
// where a warp's segment of a 16384-element chunk ends), more ties follow, and the keys above the
// cut lie in later segments: the groups and warps after the last kept tie keep none of theirs.
TEST_CASE_TEMPLATE("cuda: kept ties ending at an emit group or warp segment boundary", T, float,
                   dropit::half, dropit::bfloat16) {
  const cuda_backend gpu{};
  const std::int64_t d = 16384;
  for (const double gamma : {0.9, 0.5}) {
    const policy<chunked_min_k_selection> p{{gamma, d}};
    const std::vector<T> zeros(d, T{});
    const std::int64_t k = compress(serial, p, test::view_of(zeros, {d})).layout().kept_per_chunk;
    for (const std::int64_t kept_ties : {std::int64_t{128}, std::int64_t{2048}}) {
      if (kept_ties > k) continue;
      CAPTURE(gamma);
      CAPTURE(kept_ties);
      std::vector<T> x(d, test::make<T>(0.25));
      for (std::int64_t i = 0; i < 2 * kept_ties; ++i) x[i] = test::make<T>(1.0);
      for (std::int64_t i = 0; i < k - kept_ties; ++i) x[d / 2 + i] = test::make<T>(2.0);
      check_parity(x, {d}, p, gpu);
    }
  }
}

// A bitmask cache's mask words may lie on any 4-byte boundary (the caller's positions pointer):
// the chunk writer stores a group's four words at once only where they lie on 16 bytes. Chunks of
// 200 (7 words each) start at every offset modulo 16 bytes within one buffer; the buffer itself is
// shifted by 0 to 3 words. Min-k over a whole tensor writes its words through the same writer.
TEST_CASE_TEMPLATE("cuda: bitmask mask words at any 4-byte offset", T, float, dropit::half,
                   dropit::bfloat16) {
  const cuda_backend gpu{};
  const std::int64_t n = 5 * 1000 + 77;
  const auto x = test::nasty_values<T>(n, 23);
  const auto check = [&](const auto& p) {
    const auto want = compress(serial, p, test::view_of(x, {n}));
    REQUIRE(want.layout().encoding == position_encoding::bitmask);
    const device_buffer<T> input(x);
    for (std::size_t shift = 0; shift < 4; ++shift) {
      CAPTURE(shift);
      cuda_test::device_cache<T> got(want.layout());
      device_buffer<std::uint32_t> words(got.positions.size() + shift);
      words.poison();
      const cache_view<T> shifted{want.layout(), got.values.data(), words.data() + shift};
      const auto scratch =
          cuda_test::device_workspace(compress_workspace_bytes<T>(gpu, want.layout()));
      compress<T>(gpu, tensor_view<const T>{input.data(), want.layout().shape}, shifted,
                  cuda_test::as_workspace(scratch));
      cuda_test::finish(gpu);
      const auto all = words.download();
      std::vector<unsigned char> bytes(want.layout().position_bytes());
      std::memcpy(bytes.data(), all.data() + shift, bytes.size());
      CHECK_BITS_EQUAL(got.values.download(), test::values_of(want));
      CHECK(bytes == test::position_bytes(want));
      for (std::size_t w = 0; w < shift; ++w) CHECK(all[w] == 0xa5a5a5a5u);  // left untouched
    }
  };
  for (const double gamma : {0.5, 0.9}) {
    CAPTURE(gamma);
    for (const std::int64_t d : {200, 1000}) {
      CAPTURE(d);
      check(policy<chunked_min_k_selection>{{gamma, d}});
    }
    check(policy<min_k_selection>{{gamma}});
  }
}

// Min-k over a whole tensor of more than 2^16 elements keeps few enough values for 32-bit
// offsets; densify gives each tile of 2^14 output elements to a block, which finds its values by
// a search over the ascending offsets. Kept values on both sides of every tile boundary, at the
// tensor's ends, and tiles with none; the output also starts off a 16-byte boundary.
TEST_CASE_TEMPLATE("cuda: 32-bit offsets densified tile by tile", T, float, dropit::half,
                   dropit::bfloat16) {
  const cuda_backend gpu{};
  const std::int64_t tile = 16384, n = 5 * tile + 3;
  auto x = test::smooth_values<T>(n, 29);  // below 1 in magnitude
  std::vector<std::int64_t> large = {0, 1, n - 2, n - 1};
  for (std::int64_t b = tile; b < n; b += tile) large.insert(large.end(), {b - 1, b});
  for (std::size_t i = 0; i < large.size(); ++i)
    x[large[i]] = test::make<T>(i % 2 ? 16.0 + static_cast<double>(i) : -16.0);
  for (const double gamma : {0.9995, 0.99995}) {  // 41 and 5 kept
    CAPTURE(gamma);
    const policy<min_k_selection> p{{gamma}};
    const auto want = compress(serial, p, test::view_of(x, {n}));
    REQUIRE(want.layout().encoding == position_encoding::offsets);
    REQUIRE(want.layout().offset_bytes == 4);
    check_parity(x, {n}, p, gpu);
    // Into an output one element past an allocation's start.
    const auto cache = cuda_test::upload(want);
    device_buffer<T> out(static_cast<std::size_t>(n) + 1);
    out.poison();
    const auto scratch = cuda_test::device_workspace(densify_workspace_bytes<T>(gpu, cache.layout));
    densify<T>(gpu, cache.const_view(), tensor_view<T>{out.data() + 1, cache.layout.shape},
               cuda_test::as_workspace(scratch));
    cuda_test::finish(gpu);
    const auto all = out.download();
    CHECK_BITS_EQUAL(std::vector<T>(all.begin() + 1, all.end()), densify(serial, want));
    CHECK_BITS_EQUAL(std::vector<T>(all.begin(), all.begin() + 1),
                     std::vector<T>{test::from_bits<T>(0xa5a5a5a5u)});  // left untouched
  }
}

namespace {

__global__ void offsets_below_kernel(const std::uint32_t* offsets, std::uint32_t count,
                                     const std::uint32_t* targets, std::uint32_t target_count,
                                     std::uint32_t* found) {
  __shared__ std::uint32_t probes_below[dropit::detail::cuda::block_warps];
  for (std::uint32_t t = 0; t < target_count; ++t) {
    const std::uint32_t below =
        dropit::detail::cuda::offsets_below(offsets, count, targets[t], probes_below);
    if (threadIdx.x == 0) found[t] = below;
  }
}

}  // namespace

// The tile densify's search over ascending offsets, against std::lower_bound: 100 003 offsets take
// four rounds of narrowing (shares of 391, 2, then 1), targets at, between and beyond them, and
// ranges of 0 and 1 offsets.
TEST_CASE("cuda: the block's search over ascending offsets counts those below a target") {
  namespace dc = dropit::detail::cuda;
  for (const std::uint32_t count : {0u, 1u, 100003u}) {
    CAPTURE(count);
    std::vector<std::uint32_t> offsets(count);
    for (std::uint32_t i = 0; i < count; ++i) offsets[i] = 3 * i + i % 2 + 5;
    std::vector<std::uint32_t> targets = {0, 5, 6, 0xffffffffu};
    for (const std::uint32_t i : {1u, 255u, 256u, 390u, 391u, 782u, 50000u, 100002u}) {
      if (i >= count) continue;
      targets.insert(targets.end(), {offsets[i] - 1, offsets[i], offsets[i] + 1});
    }
    device_buffer<std::uint32_t> offsets_d(offsets), targets_d(targets), found_d(targets.size());
    dc::launch(offsets_below_kernel, {1}, nullptr, offsets_d.data(), count, targets_d.data(),
               static_cast<std::uint32_t>(targets.size()), found_d.data());
    CUDA_REQUIRE(cudaGetLastError());
    CUDA_REQUIRE(cudaDeviceSynchronize());
    const auto found = found_d.download();
    for (std::size_t t = 0; t < targets.size(); ++t) {
      CAPTURE(targets[t]);
      const auto want = std::lower_bound(offsets.begin(), offsets.end(), targets[t]);
      CHECK(found[t] == static_cast<std::uint32_t>(want - offsets.begin()));
    }
  }
}

// ReLU outputs: half the elements +0, the rest positive over a few octaves. Below γ = 0.5 the cut
// falls among the zeros, whose radix bin (digit 0, which the passes leave uncounted) holds more
// keys than the candidate buffer: the passes then run over every key, most of them outside the
// bin, and the kept zeros are the first ones. Above it the cut falls among the positive values.
// Chunks of 2^16 take the path that reads the keys from global memory (float32: no room to stage).
TEST_CASE_TEMPLATE("cuda: ReLU outputs, the cut among the zeros or above them", T, float,
                   dropit::half, dropit::bfloat16) {
  const cuda_backend gpu{};
  const std::int64_t n = 16384 + 333;  // a whole default chunk and a tail
  std::mt19937_64 rng(17);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<T> x(static_cast<std::size_t>(n));
  for (auto& v : x) v = rng() % 2 ? T{} : test::make<T>(std::fabs(normal(rng)) + 1e-3);
  for (std::int64_t d : {1000, 16384, 65536})
    for (double gamma : {0.3, 0.5, 0.9}) {
      CAPTURE(d);
      CAPTURE(gamma);
      check_parity(x, {n}, policy<chunked_min_k_selection>{{gamma, d}}, gpu);
      check_parity(x, {n}, policy<random_selection>{{.gamma = gamma, .seed = 5, .chunk_size = d}},
                   gpu);
    }
}

// Min-k over a whole tensor of more spans than one warp of the emit's look-back reads at once
// (32) and more tiles of mask words than the densify's: the radix passes with the bin holding the
// cut collected (values spread over many octaves) and not collected (values in [1, 2): an eighth
// of them; one big tie: all of them).
TEST_CASE_TEMPLATE("cuda: min-k over a whole tensor of many spans", T, float, dropit::half,
                   bfloat16) {
  const cuda_backend gpu{};
  const std::int64_t n = 40 * 16384 + 77;
  std::vector<T> narrow(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    narrow[i] = test::make<T>(1.0 + static_cast<double>(i * 7919 % 1000) / 1000.0);
  // Values spread evenly over 40 octaves: the bin holding any cut, an eighth of an octave, holds
  // about 1/250 of them, collected by the second pass of float.
  std::vector<T> spread(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    spread[i] = test::make<T>(std::ldexp(1.0 + static_cast<double>(i * 7919 % 1000) / 1000.0,
                                         static_cast<int>(i * 31 % 40) - 20));
  const std::vector<std::vector<T>> inputs = {test::smooth_values<T>(n, 31),
                                              test::nasty_values<T>(n, 32), spread, narrow,
                                              std::vector<T>(n, test::make<T>(1.0))};
  for (std::size_t input = 0; input < inputs.size(); ++input)
    for (const double gamma : {0.0, 0.5, 0.9, 0.999}) {
      CAPTURE(input);
      CAPTURE(gamma);
      check_parity(inputs[input], {n}, policy<min_k_selection>{{gamma}}, gpu);
    }
  // Either side of the largest range one block selects and of the most channels whose map the
  // densify builds in each block (both 2^13): tensors and channels.
  for (const std::int64_t m : {8191, 8192, 8193})
    for (const double gamma : {0.5, 0.9}) {
      CAPTURE(m);
      CAPTURE(gamma);
      const auto x = test::nasty_values<T>(2 * m, static_cast<std::uint64_t>(m));
      const std::vector<T> head(x.begin(), x.begin() + m);
      check_parity(head, {m}, policy<min_k_selection>{{gamma}}, gpu);
      check_parity(x, {2, m}, policy<min_k_selection, channel_granularity>{{gamma}, {1}}, gpu);
      check_parity(x, {2, m},
                   policy<random_selection, channel_granularity>{{.gamma = gamma, .seed = 5}, {1}},
                   gpu);
    }
}

namespace {

__global__ void look_back_kernel(dropit::detail::cuda::lookback_tiles tiles, std::uint32_t tile,
                                 std::uint64_t count, std::uint64_t* prefix) {
  const std::uint64_t got = dropit::detail::cuda::exclusive_prefix(tiles, tile, count);
  if (threadIdx.x == 0) *prefix = got;
}

}  // namespace

// The look-back of the last of 101 tiles whose predecessors published their own counts only
// (counted) back to the nearest inclusive prefix: through up to four windows of 32 (to tile 0). The
// span emit and the bitmask densify rely on it; their tiles only reach past one window when timing
// allows, so it is checked here on statuses set beforehand.
TEST_CASE("cuda: a look-back crosses windows of counted tiles to the nearest inclusive prefix") {
  namespace dc = dropit::detail::cuda;
  constexpr std::uint32_t tiles = 101, last = tiles - 1;
  for (const std::uint32_t inclusive_at : {0u, 5u, 60u, 99u}) {
    CAPTURE(inclusive_at);
    std::vector<std::uint32_t> zeroed(dc::lookback_tiles::zeroed_words(tiles), 0u);
    std::vector<std::uint64_t> counts(tiles, 0), inclusives(tiles, 0);
    std::uint64_t want = 1000 * (inclusive_at + 1);  // the inclusive prefix found
    inclusives[inclusive_at] = want;
    zeroed[1 + inclusive_at] = dc::tile_inclusive;
    for (std::uint32_t t = inclusive_at + 1; t < last; ++t) {
      counts[t] = t;
      zeroed[1 + t] = dc::tile_counted;
      want += t;
    }
    // Tiles before the inclusive one must not be read: garbage counts, flagged counted.
    for (std::uint32_t t = 0; t < inclusive_at; ++t) {
      counts[t] = 1u << 30;
      zeroed[1 + t] = dc::tile_counted;
    }
    device_buffer<std::uint32_t> zeroed_d(zeroed);
    device_buffer<std::uint64_t> counts_d(counts), inclusives_d(inclusives), prefix_d(1);
    const dc::lookback_tiles t{zeroed_d.data(), counts_d.data(), inclusives_d.data()};
    dc::launch(look_back_kernel, {1, 0, dim3(32)}, nullptr, t, last, 7, prefix_d.data());
    CUDA_REQUIRE(cudaGetLastError());
    CUDA_REQUIRE(cudaDeviceSynchronize());
    CHECK(prefix_d.download()[0] == want);
    CHECK(inclusives_d.download()[last] == want + 7);
    CHECK(zeroed_d.download()[1 + last] == dc::tile_inclusive);
  }
}

namespace {

/// Thread 0 of each block publishes its block's number, every block waits at the grid-wide
/// barrier, then thread 0 adds up what all the blocks published.
__global__ void grid_barrier_kernel(std::uint32_t* published, std::uint32_t* sums) {
  using word = dropit::detail::cuda::device_atomic_word;
  if (threadIdx.x == 0)
    word(published[blockIdx.x]).store(blockIdx.x + 1, ::cuda::memory_order_relaxed);
  cooperative_groups::this_grid().sync();
  if (threadIdx.x == 0) {
    std::uint32_t sum = 0;
    for (unsigned b = 0; b < gridDim.x; ++b)
      sum += word(published[b]).load(::cuda::memory_order_relaxed);
    sums[blockIdx.x] = sum;
  }
}

}  // namespace

// The whole-tensor and channel selections' blocks meet at the grid-wide barriers of one
// cooperative launch: after it, every block sees what every other wrote before it (on the
// emulated device too, whose cooperative launches must run their blocks at once for these
// selections to run on more than one block).
TEST_CASE("cuda: a cooperative launch's blocks all pass its grid-wide barrier together") {
  namespace dc = dropit::detail::cuda;
  for (const unsigned grid : {1u, 2u, 4u}) {
    CAPTURE(grid);
    device_buffer<std::uint32_t> published(std::vector<std::uint32_t>(grid, 0u)), sums(grid);
    sums.poison();
    dc::launch_cooperative(grid_barrier_kernel, nullptr, grid, "grid_barrier_kernel",
                           published.data(), sums.data());
    CUDA_REQUIRE(cudaDeviceSynchronize());
    CHECK(sums.download() == std::vector<std::uint32_t>(grid, grid * (grid + 1) / 2));
  }
}

// The look-back kernels take their tiles by ticket, so any grid is correct: the whole-tensor
// bitmask densify launched with 1, 2 and 3 blocks for 13 tiles, each block taking tile after tile
// (the backend launches a block per tile, so no other test has a block take a second one).
TEST_CASE("cuda: the look-back densify is correct with fewer blocks than tiles") {
  namespace dc = dropit::detail::cuda;
  const std::int64_t n = 12 * 8192 + 77;  // one chunk of more mask words than chunk_densify takes
  const auto x = test::smooth_values<float>(n, 41);
  const auto want = compress(serial, policy<min_k_selection>{{0.5}}, test::view_of(x, {n}));
  REQUIRE(want.layout().encoding == position_encoding::bitmask);
  const auto dense = densify(serial, want);
  const auto cache = cuda_test::upload(want);
  const std::int64_t words = static_cast<std::int64_t>(want.layout().position_bytes() / 4);
  const std::int64_t tiles = (words + dc::mask_words_per_block - 1) / dc::mask_words_per_block;
  for (const unsigned grid : {1u, 2u, 3u}) {
    CAPTURE(grid);
    device_buffer<std::uint32_t> zeroed(
        std::vector<std::uint32_t>(dc::lookback_tiles::zeroed_words(tiles), 0u));
    device_buffer<std::uint64_t> counts(static_cast<std::size_t>(tiles)),
        inclusives(static_cast<std::size_t>(tiles));
    device_buffer<float> out(static_cast<std::size_t>(n));
    out.poison();
    dc::launch(dc::mask_densify_kernel<float, float>, {grid}, nullptr, cache.layout,
               cache.positions.data(), words,
               dc::lookback_tiles{zeroed.data(), counts.data(), inclusives.data()},
               cache.values.data(), out.data());
    CUDA_REQUIRE(cudaGetLastError());
    CUDA_REQUIRE(cudaDeviceSynchronize());
    CHECK_BITS_EQUAL(out.download(), dense);
  }
}

// The whole-tensor selection's blocks take the passes' iterations grid-stride and the emit's spans
// by ticket, so any grid is correct: 1, 2 and 3 blocks for 13 spans, values spread over many
// octaves (the bin holding the cut collected) and in one (not collected). The backend launches a
// block per span up to what the device holds at once, so only tensors larger than that (over ten
// million elements on an H100) have a block take a second span.
TEST_CASE("cuda: min-k over a whole tensor is correct with fewer blocks than spans") {
  namespace dc = dropit::detail::cuda;
  const std::int64_t n = 12 * 16384 + 77;
  std::vector<float> spread(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    spread[i] = std::ldexp(1.0f + static_cast<float>(i * 7919 % 1000) / 1000.0f,
                           static_cast<int>(i * 31 % 40) - 20);
  for (const auto& x : {spread, test::nasty_values<float>(n, 43)})
    for (const double gamma : {0.5, 0.9}) {
      CAPTURE(gamma);
      const auto want = compress(serial, policy<min_k_selection>{{gamma}}, test::view_of(x, {n}));
      const cache_layout& layout = want.layout();
      REQUIRE(layout.encoding == position_encoding::bitmask);
      const device_buffer<float> input(x);
      const auto workspace = cuda_test::device_workspace(
          dropit::detail::workspace_bytes_of([&](dropit::detail::workspace_carver& carver) {
            dc::add_global_select<std::uint32_t, 32>(carver, n);
          }));
      for (const unsigned grid : {1u, 2u, 3u}) {
        CAPTURE(grid);
        cuda_test::device_cache<float> got(layout);
        dropit::detail::workspace_carver carver(cuda_test::as_workspace(workspace));
        const auto scratch = dc::add_global_select<std::uint32_t, 32>(carver, n);
        dc::select_global<std::uint32_t, 32>(
            nullptr, dc::selection_keys<min_k_selection, float>{input.data(), layout.seed, 0}, n,
            layout.kept_per_chunk, scratch,
            dc::bitmask_writer<float>{input.data(), got.values.data(), got.positions.data()}, grid);
        CUDA_REQUIRE(cudaDeviceSynchronize());
        CHECK_BITS_EQUAL(got.values.download(), test::values_of(want));
        CHECK(got.position_bytes() == test::position_bytes(want));
      }
    }
}

// The selection's scratch is transient but counts at the allocator's peak: for min-k over a whole
// tensor it must stay a small fraction of the input (a sixteenth of the float keys set aside for
// the last pass, nothing for 16-bit types, whose two passes need none), and for channels nothing
// besides the channel scores.
TEST_SUITE("deviceless") {
  TEST_CASE("cuda: the scratch of min-k over a whole tensor or its channels stays small") {
    const cuda_backend gpu{};
    const std::int64_t n = std::int64_t{64} * 256 * 56 * 56;
    const dropit::shape s{64, 256, 56, 56};
    const auto whole = policy<min_k_selection>{{0.9}};
    const auto f32 = compress_workspace_bytes<float>(gpu, plan_cache<float>(whole, s));
    CHECK(f32 > static_cast<std::size_t>(n) * sizeof(float) / 16);
    CHECK(f32 <= static_cast<std::size_t>(n) * sizeof(float) / 16 + (std::size_t{1} << 20));
    const auto bf16 = compress_workspace_bytes<bfloat16>(gpu, plan_cache<bfloat16>(whole, s));
    CHECK(bf16 <= std::size_t{1} << 20);
    const auto channels = policy<min_k_selection, channel_granularity>{{0.9}, {1}};
    const auto per_channel = compress_workspace_bytes<float>(gpu, plan_cache<float>(channels, s));
    // The run sums (a double per channel and run of 1024 elements) and a key per channel, and
    // nothing of the multi-block selection's scratch (its counters alone take 16 KiB): one block
    // selects 256 channels.
    const std::size_t runs = 64 * 56 * 56 / 1024;
    CHECK(per_channel <= (256 * runs + 256) * sizeof(double) + 1024);
  }
}

TEST_CASE("cuda: work on the caller's stream") {
  cudaStream_t stream = nullptr;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const cuda_backend gpu{stream};
  const std::int64_t n = 100000;
  const auto x = test::nasty_values<float>(n, 9);
  check_parity(x, {n}, policy<chunked_min_k_selection>{{0.9, 4096}}, gpu);
  check_parity(x, {n}, policy<min_k_selection>{{0.9}}, gpu);
  check_parity(x, {100, 1000}, policy<random_selection, channel_granularity>{{.gamma = 0.5}, {1}},
               gpu);
  // A caller that vouches for its operands (as the LibTorch adapters do) gets the same caches.
  const cuda_backend vouched{.stream = stream, .operands_on_current_device = true};
  check_parity(x, {n}, policy<chunked_min_k_selection>{{0.9, 4096}}, vouched);
  check_parity(x, {n}, policy<min_k_selection>{{0.9}}, vouched);
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

// Host threads compressing with different chunk sizes at once: the staged kernel's shared-memory
// limit is raised once per device, never lowered under another thread's launch.
TEST_CASE("cuda: concurrent host threads with different chunk sizes") {
  const std::int64_t n = 4 * 16384 + 5;
  const auto x = test::nasty_values<float>(n, 21);
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      cudaStream_t stream = nullptr;
      if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
        failures[t] = 1;
        return;
      }
      const cuda_backend gpu{stream};
      const std::int64_t chunk = t % 2 == 0 ? 16384 : 256;
      for (int round = 0; round < 20; ++round) {
        const policy<chunked_min_k_selection> p{{0.9, chunk}};
        const auto want = compress(serial, p, test::view_of(x, {n}));
        const device_buffer<float> input(x);
        const auto got = cuda_test::gpu_compress<float>(gpu, want.layout(), input);
        const auto got_values = got.values.download();
        const auto want_values = test::values_of(want);
        if (got_values.size() != want_values.size() ||
            std::memcmp(got_values.data(), want_values.data(), got_values.size() * sizeof(float)) !=
                0)
          failures[t] = 1;
      }
      cudaStreamDestroy(stream);
    });
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) {
    CAPTURE(t);
    CHECK(failures[t] == 0);
  }
}

TEST_CASE_TEMPLATE("cuda: ReLU mask matches the CPU backend", T, float, dropit::half,
                   dropit::bfloat16) {
  const cuda_backend gpu{};
  // Whole warp tiles (32 vectors of 16 bytes: 128 or 256 elements) and tiles cut short.
  for (std::int64_t n : {1, 31, 32, 33, 128, 129, 256, 257, 1000, 100003}) {
    CAPTURE(n);
    const auto y = test::nasty_values<T>(n, static_cast<std::uint64_t>(n));
    const auto dy = test::smooth_values<T>(n, static_cast<std::uint64_t>(n) + 1);
    std::vector<std::uint32_t> want_words(static_cast<std::size_t>(relu_mask_words(n)));
    pack_relu_mask<T>(serial, test::view_of(y, {n}), want_words.data());
    std::vector<T> want_dx(dy.size());
    apply_relu_mask<T>(serial, want_words.data(), test::view_of(dy, {n}),
                       test::view_of(want_dx, {n}));

    const device_buffer<T> d_y(y), d_dy(dy);
    device_buffer<std::uint32_t> d_words(want_words.size());
    device_buffer<T> d_dx(dy.size());
    d_words.poison();
    d_dx.poison();
    pack_relu_mask<T>(gpu, {d_y.data(), dropit::shape{n}}, d_words.data());
    apply_relu_mask<T>(gpu, d_words.data(), {d_dy.data(), dropit::shape{n}},
                       {d_dx.data(), dropit::shape{n}});
    cuda_test::finish(gpu);
    CHECK(d_words.download() == want_words);
    CHECK_BITS_EQUAL(d_dx.download(), want_dx);

    // The fused forward: relu(y) and the same mask, out of place and in place.
    std::vector<T> want_relu(y.size());
    relu_with_mask<T>(serial, test::view_of(y, {n}), test::view_of(want_relu, {n}),
                      want_words.data());
    device_buffer<T> d_relu(y.size());
    d_relu.poison();
    d_words.poison();
    relu_with_mask<T>(gpu, {d_y.data(), dropit::shape{n}}, {d_relu.data(), dropit::shape{n}},
                      d_words.data());
    cuda_test::finish(gpu);
    CHECK(d_words.download() == want_words);
    CHECK_BITS_EQUAL(d_relu.download(), want_relu);
    device_buffer<T> d_in_place(y);
    relu_with_mask<T>(gpu, {d_in_place.data(), dropit::shape{n}},
                      {d_in_place.data(), dropit::shape{n}}, d_words.data());
    cuda_test::finish(gpu);
    CHECK_BITS_EQUAL(d_in_place.download(), want_relu);

    // From the second element: no pointer is 16-byte aligned, so the kernels go element by
    // element; the words count from that element.
    if (n > 1) {
      const std::int64_t m = n - 1;
      const std::vector<T> y_tail(y.begin() + 1, y.end()), dy_tail(dy.begin() + 1, dy.end());
      std::vector<std::uint32_t> tail_words(static_cast<std::size_t>(relu_mask_words(m)));
      std::vector<T> tail_dx(dy_tail.size());
      pack_relu_mask<T>(serial, test::view_of(y_tail, {m}), tail_words.data());
      apply_relu_mask<T>(serial, tail_words.data(), test::view_of(dy_tail, {m}),
                         test::view_of(tail_dx, {m}));
      device_buffer<std::uint32_t> d_tail_words(tail_words.size());
      d_tail_words.poison();
      d_dx.poison();
      pack_relu_mask<T>(gpu, {d_y.data() + 1, dropit::shape{m}}, d_tail_words.data());
      apply_relu_mask<T>(gpu, d_tail_words.data(), {d_dy.data() + 1, dropit::shape{m}},
                         {d_dx.data() + 1, dropit::shape{m}});
      cuda_test::finish(gpu);
      CHECK(d_tail_words.download() == tail_words);
      const std::vector<T> dx = d_dx.download();
      CHECK_BITS_EQUAL(std::vector<T>(dx.begin() + 1, dx.end()), tail_dx);
    }
  }
}

TEST_CASE_TEMPLATE("cuda: channels-last ReLU mask matches the CPU backend", T, float, dropit::half,
                   dropit::bfloat16) {
  const cuda_backend gpu{};
  // Planes that start mid-word, tiles cut short in both directions, one channel, whole tiles.
  for (const dropit::shape& logical :
       {dropit::shape{3, 70, 7, 5}, dropit::shape{2, 130, 9, 9}, dropit::shape{5, 1, 3, 11},
        dropit::shape{2, 64, 8, 8}, dropit::shape{1, 33, 40, 41}}) {
    const std::int64_t n = logical.numel();
    CAPTURE(n);
    const auto x = test::nasty_values<T>(n, static_cast<std::uint64_t>(n));
    const auto dy = test::smooth_values<T>(n, static_cast<std::uint64_t>(n) + 1);
    std::vector<std::uint32_t> want_words(static_cast<std::size_t>(relu_mask_words(n)));
    std::vector<T> want_y(x.size()), want_dx(dy.size());
    relu_with_mask_channels_last<T>(serial, {x.data(), logical}, {want_y.data(), logical},
                                    want_words.data());
    apply_relu_mask_channels_last<T>(serial, want_words.data(), {dy.data(), logical},
                                     {want_dx.data(), logical});

    const device_buffer<T> d_x(x), d_dy(dy);
    device_buffer<std::uint32_t> d_words(want_words.size());
    device_buffer<T> d_y(x.size()), d_dx(dy.size());
    d_words.poison();
    d_y.poison();
    d_dx.poison();
    relu_with_mask_channels_last<T>(gpu, {d_x.data(), logical}, {d_y.data(), logical},
                                    d_words.data());
    apply_relu_mask_channels_last<T>(gpu, d_words.data(), {d_dy.data(), logical},
                                     {d_dx.data(), logical});
    cuda_test::finish(gpu);
    CHECK(d_words.download() == want_words);
    CHECK_BITS_EQUAL(d_y.download(), want_y);
    CHECK_BITS_EQUAL(d_dx.download(), want_dx);
  }
}

// A channels-last input: its cache is the CPU backend's of the same input, which is the contiguous
// tensor's (tests/test_compress.cpp), byte for byte, for every policy.
TEST_CASE_TEMPLATE("cuda: compress of a channels-last tensor matches the CPU backend", T, float,
                   dropit::half, dropit::bfloat16) {
  const cuda_backend gpu{};
  // Tiles cut short in both directions, one channel, whole tiles (small: racecheck runs it).
  for (const dropit::shape& logical : {dropit::shape{3, 70, 7, 5}, dropit::shape{5, 1, 3, 11},
                                       dropit::shape{2, 64, 8, 8}, dropit::shape{1, 33, 20, 21}}) {
    CAPTURE(logical.numel());
    const auto stored = test::smooth_values<T>(logical.numel(), 17);
    const device_buffer<T> d_stored(stored);
    test::for_each_policy(0.8, 1, [&](const auto& p, const char* name) {
      CAPTURE(name);
      const cache_layout layout = plan_cache<T>(p, logical);
      std::vector<T> values(static_cast<std::size_t>(layout.kept()));
      std::vector<unsigned char> positions(layout.position_bytes());
      std::vector<std::byte> memory(compress_channels_last_workspace_bytes<T>(serial, layout));
      compress_channels_last<T>(serial, test::view_of(stored, logical),
                                {layout, values.data(), positions.data()}, memory);

      cuda_test::device_cache<T> out(layout);
      const auto scratch =
          cuda_test::device_workspace(compress_channels_last_workspace_bytes<T>(gpu, layout));
      compress_channels_last<T>(gpu, {d_stored.data(), logical}, out.view(),
                                cuda_test::as_workspace(scratch));
      cuda_test::finish(gpu);
      CHECK_BITS_EQUAL(out.values.download(), values);
      CHECK(out.position_bytes() == positions);
    });
  }
}

TEST_CASE("cuda: bad inputs throw dropit::error naming the value") {
  const cuda_backend gpu{};
  // More elements than one block selects from: min-k over the tensor then needs a workspace, whose
  // checks are among those below.
  const std::int64_t n = 10000;
  const auto host = test::smooth_values<float>(n, 1);
  const device_buffer<float> input(host);
  const auto layout = plan_cache<float>(policy<min_k_selection>{{0.9}}, dropit::shape{n});
  cuda_test::device_cache<float> out(layout);
  const auto scratch = cuda_test::device_workspace(compress_workspace_bytes<float>(gpu, layout));
  const workspace ws = cuda_test::as_workspace(scratch);
  REQUIRE(ws.size() > 0);
  const tensor_view<const float> in{input.data(), dropit::shape{n}};

  // Host memory where device memory is expected (unless the device reads pageable memory).
  int device = 0, pageable = 0;
  CUDA_REQUIRE(cudaGetDevice(&device));
  CUDA_REQUIRE(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, device));
  std::vector<float> host_values(static_cast<std::size_t>(layout.kept()));
  std::vector<std::byte> host_scratch(scratch.size());
  std::vector<float> host_dense(static_cast<std::size_t>(n));
  std::vector<std::uint32_t> host_words(static_cast<std::size_t>(relu_mask_words(n)));
  if (pageable != 0) {
    MESSAGE("this device reads pageable host memory: host-pointer checks not applicable");
  } else {
    CHECK_ERROR(compress<float>(gpu, test::view_of(host, {n}), out.view(), ws), "compress input",
                "host memory");
    CHECK_ERROR(compress<float>(gpu, in, {layout, host_values.data(), out.positions.data()}, ws),
                "cache values buffer", "host memory");
    CHECK_ERROR(compress<float>(gpu, in, out.view(), workspace(host_scratch)), "compress workspace",
                "host memory");
    CHECK_ERROR(densify<float>(gpu, out.const_view(), test::view_of(host_dense, {n}),
                               cuda_test::as_workspace(cuda_test::device_workspace(
                                   densify_workspace_bytes<float>(gpu, layout)))),
                "densify output", "host memory");
    CHECK_ERROR(pack_relu_mask<float>(gpu, in, host_words.data()), "ReLU mask buffer",
                "host memory");
  }

  // The checks the CPU backend makes, made by the CUDA overloads too.
  CHECK_ERROR(compress<float>(gpu, in, out.view(), ws.first(ws.size() - 1)), "compress",
              "workspace of", std::to_string(ws.size() - 1));
  CHECK_ERROR(compress<float>(gpu, in, {layout, nullptr, out.positions.data()}, ws),
              "values buffer is null");
  CHECK_ERROR(compress<float>(gpu, {input.data(), dropit::shape{n - 1}}, out.view(), ws),
              "compress input", "[9999]", "[10000]");
  CHECK_ERROR(compress_workspace_bytes<dropit::half>(gpu, layout), "float32", "float16");
  CHECK_ERROR(densify_workspace_bytes<bfloat16>(gpu, layout), "float32", "bfloat16");

  device_buffer<float> dense(static_cast<std::size_t>(n));
  CHECK_ERROR(densify<float>(gpu, out.const_view(), {dense.data(), dropit::shape{n, 1}}, {}),
              "densify output", "[10000, 1]");
  CHECK_ERROR(pack_relu_mask<float>(gpu, in, nullptr), "null");

  // None of that left an error behind: a good call still works.
  check_parity(host, {n}, policy<min_k_selection>{{0.9}}, gpu);
}
