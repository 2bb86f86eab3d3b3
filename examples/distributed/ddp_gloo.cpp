// Data-parallel training of a dropit model with c10d's ProcessGroupGloo, on the CPU.
//
//   dropit_ddp_gloo                          # 2 ranks, 30 steps
//   dropit_ddp_gloo --world-size 4 --steps 50 --batch 128
//   dropit_ddp_gloo --checkpoint             # every layer checkpointed (dropit::torch::Checkpoint)
//
// The program forks one process per rank. The ranks meet through a c10d::FileStore in a fresh
// temporary directory and talk over loopback TCP (127.0.0.1) only. Each rank converts the same MLP
// with dropit::torch::convert, trains it on its shard of every batch, averages the gradients with
// an all-reduce and steps SGD: what torch's DistributedDataParallel does, written out by hand
// because LibTorch's C++ API has no DDP module. dropit layers are ordinary autograd functions, so
// nothing about them changes under data parallelism.
//
// The program checks, and exits non-zero if any check fails:
//   (a) after the first backward, the averaged gradient equals the gradient the same dropit model
//       computes on the whole batch in one process (with --checkpoint: the same model without the
//       checkpoints, so that recomputing in backward is checked to change no gradient);
//   (b) after training, every rank holds bit-identical parameters;
//   (c) the training loss went down.

#include <dropit/torch.hpp>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

// Resolved at run time from the OpenBLAS that LibTorch loads; null when LibTorch uses another BLAS.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace {

struct Options {
  int world_size = 2;
  int steps = 30;
  std::int64_t batch = 64;  // global batch, split evenly across the ranks
  double lr = 0.2;
  bool checkpoint = false;  // every layer run again in backward (dropit::torch::checkpoint_each)
};

constexpr std::int64_t in_features = 32;
constexpr std::int64_t hidden = 64;
constexpr std::int64_t classes = 10;

/// The MLP, converted. Chunked min-k keeps a fixed count per chunk of D consecutive input
/// elements. Both converted Linears (the first keeps its input; ReLUs keep a mask, not a
/// selection) take inputs of shape [rows, hidden], so with D = hidden every chunk is exactly one
/// sample's row. A rank's shard is then a whole number of chunks, and the chunks it selects from
/// are the very chunks the whole-batch forward selects from: the averaged sparse gradient equals
/// the single-process one, up to summation order. With a chunk straddling two ranks' samples, the
/// two would keep different elements.
torch::nn::Sequential make_model(dropit::torch::ConvertReport* report = nullptr) {
  torch::nn::Sequential model(torch::nn::Linear(in_features, hidden), torch::nn::ReLU(),
                              torch::nn::Linear(hidden, hidden), torch::nn::ReLU(),
                              torch::nn::Linear(hidden, classes));
  auto converted = dropit::torch::convert(
      model, dropit::torch::ConvertOptions()
                 .dropit(dropit::torch::DropitOptions().gamma(0.8).chunk_size(hidden))
                 .relu(true));
  if (report != nullptr) *report = std::move(converted);
  return model;
}

/// A fixed synthetic task, the same on every rank: labels from a random linear teacher.
std::pair<at::Tensor, at::Tensor> make_dataset(std::int64_t size) {
  torch::manual_seed(0);
  at::Tensor teacher = torch::randn({in_features, classes});
  at::Tensor x = torch::randn({size, in_features});
  return {x, x.matmul(teacher).argmax(1)};
}

std::vector<at::Tensor> gradients(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params) grads.push_back(p.grad().detach().clone());
  return grads;
}

at::Tensor flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  for (const auto& t : tensors) flat.push_back(t.detach().reshape(-1));
  return torch::cat(flat);
}

at::Tensor all_reduce(c10d::ProcessGroup& group, at::Tensor tensor,
                      c10d::ReduceOp op = c10d::ReduceOp::SUM) {
  std::vector<at::Tensor> buffer{std::move(tensor)};
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  group.allreduce(buffer, options)->wait();
  return buffer[0];
}

/// Replaces every gradient by its mean over the ranks. Like DDP's gradient buckets, the gradients
/// travel as one flat buffer: one collective per step instead of one per parameter.
void average_gradients(c10d::ProcessGroup& group, const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params) grads.push_back(p.grad());
  at::Tensor mean = all_reduce(group, flatten(grads)).div_(group.getSize());
  std::int64_t offset = 0;
  for (auto& g : grads) {
    g.copy_(mean.narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
}

/// Starts every replica from rank 0's parameters, as DDP does when it wraps a model.
void broadcast_parameters(c10d::ProcessGroup& group, const std::vector<at::Tensor>& params) {
  for (const auto& p : params) {
    std::vector<at::Tensor> buffer{p.detach()};  // shares p's storage: broadcast writes in place
    group.broadcast(buffer)->wait();
  }
}

/// True when all ranks hold bit-identical parameters: their elementwise max equals their min.
bool replicas_identical(c10d::ProcessGroup& group, const std::vector<at::Tensor>& params) {
  at::Tensor local = flatten(params);
  at::Tensor high = all_reduce(group, local.clone(), c10d::ReduceOp::MAX);
  at::Tensor low = all_reduce(group, local.clone(), c10d::ReduceOp::MIN);
  return torch::equal(high, low);
}

/// One line to stdout in a single write, so the ranks' lines do not interleave.
void say(int rank, const std::string& text) {
  std::cout << "[rank " << rank << "] " + text + "\n" << std::flush;
}

std::string check_line(bool ok, const std::string& what) {
  return std::string(ok ? "PASS " : "FAIL ") + what;
}

int run_rank(int rank, const Options& options, const std::string& store_path) {
  // The ranks are the parallelism: one thread each keeps them from oversubscribing the cores.
  at::set_num_threads(1);
  if (openblas_set_num_threads != nullptr) openblas_set_num_threads(1);

  auto store = c10::make_intrusive<c10d::FileStore>(store_path, options.world_size);
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(60));
  gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  c10d::ProcessGroupGloo group(store, rank, options.world_size, gloo_options);

  torch::manual_seed(1000 + rank);  // different on every rank until the broadcast below
  dropit::torch::ConvertReport report;
  torch::nn::Sequential model = make_model(&report);
  if (rank == 0) {
    std::ostringstream text;
    text << report;
    say(rank, text.str());
  }
  const std::vector<at::Tensor> params = model->parameters();
  broadcast_parameters(group, params);
  // With --checkpoint, the first step's reference is a plain replica: the same parameters, no
  // checkpoint.
  torch::nn::Sequential reference_model = model;
  if (options.checkpoint) {
    reference_model = make_model();
    torch::NoGradGuard no_grad;
    const std::vector<at::Tensor> replica = reference_model->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) replica[i].copy_(params[i]);
    dropit::torch::checkpoint_each(*model);
  }
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(options.lr).momentum(0.9));

  const auto [x, y] = make_dataset(options.batch);
  const std::int64_t shard = options.batch / options.world_size;
  const at::Tensor x_local = x.narrow(0, rank * shard, shard);
  const at::Tensor y_local = y.narrow(0, rank * shard, shard);

  bool ok = true;
  double first_loss = 0, last_loss = 0;
  for (int step = 0; step < options.steps; ++step) {
    std::vector<at::Tensor> reference;
    if (step == 0) {  // the same model (or its plain replica), one process, the whole batch
      optimizer.zero_grad();
      torch::nn::functional::cross_entropy(reference_model->forward(x), y).backward();
      reference = gradients(reference_model->parameters());
    }

    optimizer.zero_grad();
    at::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x_local), y_local);
    loss.backward();
    average_gradients(group, params);

    if (step == 0) {
      const at::Tensor got = flatten(gradients(params)), want = flatten(reference);
      const bool same = torch::allclose(got, want, /*rtol=*/1e-4, /*atol=*/1e-6);
      ok &= same;
      std::ostringstream text;
      text << "averaged gradient == whole-batch gradient"
           << (options.checkpoint ? " of the model without checkpoints" : "") << " (max |diff| "
           << (got - want).abs().max().item<double>() << ", max |grad| "
           << want.abs().max().item<double>() << ")";
      say(rank, check_line(same, text.str()));
    }
    optimizer.step();

    // Equal shards: the mean of the shard losses is the whole batch's loss.
    const double global_loss = all_reduce(group, loss.detach().clone()).item<double>() /
                               options.world_size;
    if (step == 0) first_loss = global_loss;
    last_loss = global_loss;
    const int log_every = std::max(1, options.steps / 4);
    if (rank == 0 && (step % log_every == 0 || step + 1 == options.steps))
      say(rank, "step " + std::to_string(step) + "  loss " + std::to_string(global_loss));
  }

  const bool identical = replicas_identical(group, params);
  ok &= identical;
  say(rank, check_line(identical, "parameters bit-identical across " +
                                      std::to_string(options.world_size) + " ranks"));
  const bool decreased = last_loss < first_loss;
  ok &= decreased;
  say(rank, check_line(decreased, "loss decreased from " + std::to_string(first_loss) + " to " +
                                      std::to_string(last_loss)));
  return ok ? 0 : 1;
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--checkpoint") {
      options.checkpoint = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument("missing value after " + flag);
    const std::string value = argv[++i];
    if (flag == "--world-size") options.world_size = std::stoi(value);
    else if (flag == "--steps") options.steps = std::stoi(value);
    else if (flag == "--batch") options.batch = std::stoll(value);
    else if (flag == "--lr") options.lr = std::stod(value);
    else throw std::invalid_argument("unknown option " + flag);
  }
  if (options.world_size < 1 || options.steps < 1 || options.batch % options.world_size != 0 ||
      options.batch < options.world_size)
    throw std::invalid_argument("need --world-size >= 1, --steps >= 1 and a --batch that is a "
                                "positive multiple of the world size");
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    options = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "dropit_ddp_gloo: " << e.what()
              << "\nusage: dropit_ddp_gloo [--world-size N] [--steps N] [--batch N] [--lr X] "
                 "[--checkpoint]\n";
    return 2;
  }

  std::string dir = (std::filesystem::temp_directory_path() / "dropit-ddp-XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) {
    std::perror("dropit_ddp_gloo: mkdtemp");
    return 1;
  }
  const std::string store_path = dir + "/store";

  // Fork before anything starts a thread pool: a forked child keeps only the calling thread.
  std::map<pid_t, int> children;  // pid -> rank
  for (int rank = 0; rank < options.world_size; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("dropit_ddp_gloo: fork");
      for (const auto& child : children) kill(child.first, SIGTERM);
      break;
    }
    if (pid == 0) {
      int rc = 1;
      try {
        rc = run_rank(rank, options, store_path);
      } catch (const std::exception& e) {
        say(rank, std::string("FAIL ") + e.what());
      }
      std::_Exit(rc);  // leave the parent's cleanup to the parent
    }
    children.emplace(pid, rank);
  }

  // When a rank fails, stop the others rather than let them wait for it until Gloo's timeout.
  bool failed = static_cast<int>(children.size()) != options.world_size;
  while (!children.empty()) {
    int status = 0;
    const pid_t pid = wait(&status);
    if (pid < 0) break;
    const int rank = children.at(pid);
    children.erase(pid);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    if (WIFSIGNALED(status))
      std::cerr << "rank " << rank << " killed by signal " << WTERMSIG(status) << "\n";
    else
      std::cerr << "rank " << rank << " exited with status " << WEXITSTATUS(status) << "\n";
    if (!failed) {
      failed = true;
      for (const auto& child : children) kill(child.first, SIGTERM);
    }
  }
  std::filesystem::remove_all(dir);
  std::cout << (failed ? "FAILED" : "all checks passed on " + std::to_string(options.world_size) +
                                         " ranks")
            << "\n";
  return failed ? 1 : 0;
}
