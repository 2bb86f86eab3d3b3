#pragma once
// Fashion-MNIST through LibTorch's own MNIST reader: the dataset uses MNIST's idx format and, once
// the build has unpacked Debian's .gz files, MNIST's file names.

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace fmnist {

/// Images [N, 1, 28, 28] as normalised float32 and labels [N] as int64, contiguous.
struct Split {
  torch::Tensor images;
  torch::Tensor labels;

  std::int64_t size() const { return images.size(0); }
};

struct Dataset {
  Split train, test;
};

// Per-pixel mean and standard deviation of the Fashion-MNIST training images (in [0, 1]).
inline constexpr double pixel_mean = 0.2860;
inline constexpr double pixel_std = 0.3530;

inline void expect_files(const std::string& directory) {
  for (const char* name : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                           "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    if (!std::filesystem::is_regular_file(std::filesystem::path(directory) / name))
      throw std::runtime_error(
          "Fashion-MNIST: " + (std::filesystem::path(directory) / name).string() +
          " not found. Install the data (Debian: apt-get install dataset-fashion-mnist, or "
          "scripts/install-deps) and rebuild, which unpacks it into the build tree; or pass "
          "--data-dir with a directory holding the four unpacked idx files.");
  }
}

/// The first `limit` examples of one split (all when `limit` is 0 or larger than the split).
inline Split load_split(const std::string& directory, bool train, std::int64_t limit) {
  using torch::data::datasets::MNIST;
  const MNIST mnist(directory, train ? MNIST::Mode::kTrain : MNIST::Mode::kTest);
  torch::Tensor images = mnist.images();  // [N, 1, 28, 28] in [0, 1]
  torch::Tensor labels = mnist.targets();
  if (limit > 0 && limit < images.size(0)) {
    images = images.narrow(0, 0, limit);
    labels = labels.narrow(0, 0, limit);
  }
  return {((images - pixel_mean) / pixel_std).contiguous(), labels.to(torch::kLong).contiguous()};
}

inline Dataset load(const std::string& directory, std::int64_t train_limit,
                    std::int64_t test_limit) {
  expect_files(directory);
  return {load_split(directory, true, train_limit), load_split(directory, false, test_limit)};
}

}  // namespace fmnist
