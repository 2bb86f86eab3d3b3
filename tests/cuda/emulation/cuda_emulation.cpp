// The emulated device's scheduler and the CUDA runtime functions the backend and its tests call
// (see cuda_emulation.hpp): memory is host memory, every operation completes before it returns,
// and a launch runs up to resident_blocks blocks at once, each on a host thread of its own (the
// launching thread and a pool of helpers), each block's threads as fibers of that thread.

#include "cuda_emulation.hpp"

#include <ucontext.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

thread_local cudaError_t last_error = cudaSuccess;

/// Records a failure as the runtime's last error (cudaGetLastError), and returns it.
cudaError_t record(cudaError_t status) {
  if (status != cudaSuccess) last_error = status;
  return status;
}

/// Dynamic shared memory per block: an H100's or H200's.
constexpr std::size_t shared_bytes_per_block = 227 * 1024;

}  // namespace

namespace dropit_emulation {
namespace {

constexpr std::size_t fiber_stack_bytes = 256 * 1024;
/// How long a thread may wait at __nanosleep in a row (spinning on what another block publishes)
/// before it is taken to spin forever: on a block that never runs or never publishes.
constexpr std::chrono::seconds spin_limit{60};

constexpr const char* exited_before_barrier =
    "emulated CUDA: deadlock at a grid-wide barrier that a block exited without reaching";

/// One launch: its blocks, handed out in order to the host threads that run them, and what the
/// blocks share — the grid-wide barrier of a cooperative launch, and the launch's first failure,
/// which stops the others.
struct grid_run {
  dim3 grid, block;
  std::size_t shared_bytes = 0;
  const std::function<void()>* body = nullptr;
  std::uint64_t seed = 0;  // draws each block's order of threads
  unsigned long long blocks = 0;
  bool cooperative = false;
  std::atomic<unsigned long long> next_block{0};
  std::atomic<bool> failed{false};

  std::mutex mutex;  // guards what follows
  std::condition_variable changed;
  unsigned long long arrived = 0, finished = 0;  // at the grid-wide barrier; blocks done
  std::uint64_t generation = 0;                  // of the grid-wide barrier
  std::exception_ptr failure;                    // the first

  /// Records `error` as the launch's failure unless one came first; wakes every waiting block.
  void fail(std::exception_ptr error) {
    const std::lock_guard<std::mutex> lock(mutex);
    fail_locked(error);
  }
  void fail_locked(std::exception_ptr error) {
    if (!failure) failure = error;
    failed = true;
    changed.notify_all();
  }
  void fail_locked(const std::string& why) {
    fail_locked(std::make_exception_ptr(std::runtime_error(why)));
  }

  /// The grid-wide barrier, for one thread of each block: false where the launch failed (here or
  /// elsewhere) instead.
  bool wait_at_barrier() {
    std::unique_lock<std::mutex> lock(mutex);
    if (!cooperative) {
      fail_locked("emulated CUDA: a grid-wide barrier in a launch that is not cooperative");
      return false;
    }
    if (finished != 0) {
      fail_locked(exited_before_barrier);
      return false;
    }
    const std::uint64_t at = generation;
    if (++arrived == blocks) {
      arrived = 0;
      ++generation;
      changed.notify_all();
      return !failed;
    }
    changed.wait(lock, [&] { return generation != at || failed; });
    return !failed;
  }

  /// A block has exited: blocks waiting at the barrier for it never will be released.
  void block_finished() {
    const std::lock_guard<std::mutex> lock(mutex);
    ++finished;
    if (arrived != 0) fail_locked(exited_before_barrier);
  }
};

/// Threads that wait until all live ones have arrived; a thread that exits stops being awaited.
struct barrier {
  unsigned expected = 0, arrived = 0;
  std::uint64_t generation = 0;
  /// Releases the waiting threads where no live one is missing.
  void release_if_complete() {
    if (arrived != 0 && arrived == expected) {
      arrived = 0;
      ++generation;
    }
  }
};

/// A warp's collectives: each lane writes its value and waits for the others'; the lane whose
/// arrival completes the round (or whose exit does) records which lanes took part, and every lane
/// then reads the values. Consecutive rounds alternate between two buffers: a lane writes a buffer
/// again two rounds later, after every lane has passed the barrier of the round between, and so
/// has read it.
struct warp {
  barrier sync;
  std::uint64_t values[2][32] = {};
  std::uint32_t taking_part = 0;    // lanes arrived in the current round
  std::uint32_t took_part[2] = {};  // by buffer: the lanes of its last completed round
  unsigned buffer = 0;              // the current round's

  void complete_round() {
    took_part[buffer] = taking_part;
    taking_part = 0;
    buffer ^= 1u;
  }
};

// Switching between a block's threads. On x86-64, a switch saves the callee-saved registers on
// the current stack and moves to the other stack: no system call, where swapcontext also saves the
// signal mask (a system call on every switch, which took most of the time). The floating-point
// control words, which no kernel changes, are not switched. Elsewhere, ucontext.
#if defined(__x86_64__)
extern "C" void dropit_emulation_switch(void** save_stack, void* load_stack);
asm(R"(
  .text
  .globl dropit_emulation_switch
  .type dropit_emulation_switch, @function
dropit_emulation_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size dropit_emulation_switch, .-dropit_emulation_switch
)");

struct context {
  void* stack_pointer = nullptr;
};
/// Prepares `c` to start `entry` (which must never return) on the stack [stack, stack + bytes).
void start_context(context& c, std::byte* stack, std::size_t bytes, void (*entry)(), context*) {
  auto top = reinterpret_cast<std::uintptr_t>(stack + bytes) & ~std::uintptr_t{15};
  auto* slots = reinterpret_cast<std::uint64_t*>(top);
  *--slots = 0;                                       // entry's "return address": rsp % 16 == 8
  *--slots = reinterpret_cast<std::uint64_t>(entry);  // where the switch's ret goes
  for (int r = 0; r < 6; ++r) *--slots = 0;           // rbp, rbx, r12 .. r15
  c.stack_pointer = slots;
}
void switch_context(context& from, context& to) {
  dropit_emulation_switch(&from.stack_pointer, to.stack_pointer);
}
#else
struct context {
  ucontext_t state{};
};
void start_context(context& c, std::byte* stack, std::size_t bytes, void (*entry)(),
                   context* back) {
  getcontext(&c.state);
  c.state.uc_stack.ss_sp = stack;
  c.state.uc_stack.ss_size = bytes;
  c.state.uc_link = &back->state;
  makecontext(&c.state, entry, 0);
}
void switch_context(context& from, context& to) { swapcontext(&from.state, &to.state); }
#endif

struct fiber {
  context resume;
  std::unique_ptr<std::byte[]> stack;
  thread_position position{};
  unsigned warp = 0, lane = 0;
  const std::uint64_t* waiting_on = nullptr;  // a barrier's generation, until it moves on
  std::uint64_t waiting_from = 0;
  // The first of its waits at __nanosleep since its last barrier or collective.
  std::optional<std::chrono::steady_clock::time_point> spinning_since;
  bool finished = false;
  std::vector<std::pair<void*, const void*>> pending_copies;  // 16 bytes each, until the wait

  bool runnable() const {
    return !finished && (waiting_on == nullptr || *waiting_on != waiting_from);
  }
};

/// One block being run on the calling host thread.
struct block_run {
  grid_run* grid = nullptr;
  std::vector<fiber> fibers;  // kept between launches: their stacks are reused
  unsigned threads = 0;
  std::vector<warp> warps;
  barrier block;
  std::vector<uint4> shared;  // dynamic shared memory
  context scheduler;          // run_block, to which a thread returns when none can run
  unsigned running = 0;
  std::string stopped;            // why the block was stopped with threads left (spinning, failure)
  std::uint64_t schedule = 0;     // the random state that draws the block's order (schedule_seed)
  std::vector<unsigned> order;    // the block's threads in the order they take turns
  std::vector<unsigned> turn_of;  // each thread's place in `order`

  /// A pseudo-random number below `bound` (xorshift64*).
  unsigned pick(unsigned bound) {
    schedule ^= schedule >> 12;
    schedule ^= schedule << 25;
    schedule ^= schedule >> 27;
    return static_cast<unsigned>((schedule * 0x2545f4914f6cdd1dull) >> 32) % bound;
  }
};

/// The order in which a block's threads take turns is drawn for each block, from
/// DROPIT_EMULATION_SEED (1 where unset): so that kernels cannot rely on an order of their threads
/// that the hardware does not promise (lane 0 before lane 31, thread 0 first), while a seed
/// reproduces a run.
std::uint64_t schedule_seed() {
  static const std::uint64_t seed = [] {
    const char* text = std::getenv("DROPIT_EMULATION_SEED");
    const std::uint64_t value = text != nullptr ? std::strtoull(text, nullptr, 10) : 1;
    return value * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;  // never 0
  }();
  return seed;
}

thread_local block_run* active = nullptr;
std::mutex launch_mutex;  // one launch at a time: the helper threads serve one

fiber& running_fiber() {
  if (active == nullptr) {
    std::fprintf(stderr, "emulated CUDA: a device function was called outside a launch\n");
    std::abort();
  }
  return active->fibers[active->running];
}

/// Switches from the running thread (waiting, spinning or exited) to the next one in the block's
/// order that can run (itself, last, where `self_last`); to the scheduler where none can.
void switch_away(bool self_last) {
  block_run& run = *active;
  fiber& self = run.fibers[run.running];
  const unsigned turn = run.turn_of[run.running];
  const unsigned steps = self_last ? run.threads : run.threads - 1;
  for (unsigned step = 1; step <= steps; ++step) {
    const unsigned t = run.order[(turn + step) % run.threads];
    fiber& next = run.fibers[t];
    if (!next.runnable()) continue;
    if (t == run.running) return;  // the spinning thread itself, the only one that can run
    next.waiting_on = nullptr;
    run.running = t;
    current_position = &next.position;
    switch_context(self.resume, next.resume);
    return;
  }
  switch_context(self.resume, run.scheduler);
}

/// Stops the running block for `why` (it is not resumed): run_block throws.
[[noreturn]] void stop_block(const std::string& why) {
  active->stopped = why;
  switch_context(running_fiber().resume, active->scheduler);
  std::abort();  // never resumed
}

/// Waits at `b`; true for the thread whose arrival completed it (which goes on at once).
bool wait_at(barrier& b) {
  running_fiber().spinning_since.reset();
  const std::uint64_t generation = b.generation;
  ++b.arrived;
  b.release_if_complete();
  if (b.generation != generation) return true;
  fiber& f = running_fiber();
  f.waiting_on = &b.generation;
  f.waiting_from = generation;
  switch_away(false);
  return false;
}

void fiber_main() {
  (*active->grid->body)();
  fiber& f = running_fiber();
  f.finished = true;
  // An exited thread is no longer awaited at its block's and warp's barriers.
  warp& w = active->warps[f.warp];
  --w.sync.expected;
  if (w.sync.arrived != 0 && w.sync.arrived == w.sync.expected) w.complete_round();
  w.sync.release_if_complete();
  --active->block.expected;
  active->block.release_if_complete();
  switch_away(false);  // never resumed
  std::abort();
}

void shuffle(std::vector<unsigned>& items, block_run& run) {
  for (std::size_t i = items.size(); i > 1; --i)
    std::swap(items[i - 1], items[run.pick(static_cast<unsigned>(i))]);
}

/// Where thread t's stack starts: staggered by a cache line per thread, so that the tops of the
/// stacks (equal multiples of the page size apart) do not all fall in one set of the caches.
std::size_t stack_bytes_of(unsigned t) { return fiber_stack_bytes - 64 * (t % 64); }

void run_block(block_run& run, uint3 block_index) {
  const dim3 grid = run.grid->grid, block = run.grid->block;
  const unsigned threads = block.x * block.y * block.z;
  run.threads = threads;
  run.block = barrier{threads, 0, 0};
  run.warps.assign((threads + 31) / 32, warp{});
  for (unsigned w = 0; w < run.warps.size(); ++w) {
    const unsigned lanes = std::min(32u, threads - 32 * w);
    run.warps[w].sync = barrier{lanes, 0, 0};
  }
  // Shared memory holds garbage on a device: reads of what no thread wrote show up.
  std::memset(run.shared.data(), 0xa5, run.shared.size() * sizeof(uint4));
  if (run.fibers.size() < threads) run.fibers.resize(threads);
  for (unsigned t = 0; t < threads; ++t) {
    fiber& f = run.fibers[t];
    if (!f.stack) f.stack = std::make_unique<std::byte[]>(fiber_stack_bytes);
    f.position = {uint3{t % block.x, t / block.x % block.y, t / (block.x * block.y)}, block_index,
                  block, grid};
    f.warp = t / 32;
    f.lane = t % 32;
    f.waiting_on = nullptr;
    f.spinning_since.reset();
    f.finished = false;
    f.pending_copies.clear();
    start_context(f.resume, f.stack.get(), stack_bytes_of(t), fiber_main, &run.scheduler);
  }
  // The warps in a drawn order, each warp's lanes in a drawn order, one after another (a warp's
  // lanes next to each other in the ring, so that a completed collective finds them soon).
  std::vector<unsigned> warp_order(run.warps.size());
  for (unsigned w = 0; w < warp_order.size(); ++w) warp_order[w] = w;
  shuffle(warp_order, run);
  run.order.clear();
  for (const unsigned w : warp_order) {
    std::vector<unsigned> lanes;
    for (unsigned t = 32 * w; t < std::min(threads, 32 * w + 32); ++t) lanes.push_back(t);
    shuffle(lanes, run);
    run.order.insert(run.order.end(), lanes.begin(), lanes.end());
  }
  run.turn_of.resize(threads);
  for (unsigned turn = 0; turn < threads; ++turn) run.turn_of[run.order[turn]] = turn;
  // The threads switch among themselves (a thread runs until it waits or exits) and come back
  // here when none can run: all have exited, or the block is stuck.
  run.running = run.order[0];
  run.stopped.clear();
  current_position = &run.fibers[run.running].position;
  switch_context(run.scheduler, run.fibers[run.running].resume);
  const std::string block_name =
      "block (" + std::to_string(block_index.x) + ", " + std::to_string(block_index.y) + ")";
  if (!run.stopped.empty())
    throw std::runtime_error("emulated CUDA: thread " + std::to_string(run.running) + " of " +
                             block_name + " " + run.stopped);
  for (unsigned t = 0; t < threads; ++t)
    if (!run.fibers[t].finished)
      throw std::runtime_error("emulated CUDA: deadlock in " + block_name +
                               ": its live threads all wait at barriers (__syncthreads or a warp "
                               "collective) that others never reach");
}

/// Runs blocks of `grid` on the calling host thread, in order, until none is left or the launch
/// has failed.
void run_blocks(grid_run& grid) {
  thread_local block_run run;  // its fibers' stacks are reused from launch to launch
  try {
    run.grid = &grid;
    run.shared.assign((grid.shared_bytes + sizeof(uint4) - 1) / sizeof(uint4), uint4{});
  } catch (...) {
    grid.fail(std::current_exception());
    return;
  }
  active = &run;
  for (unsigned long long b; !grid.failed && (b = grid.next_block++) < grid.blocks;) {
    const dim3 g = grid.grid;
    const uint3 index{static_cast<unsigned>(b % g.x), static_cast<unsigned>(b / g.x % g.y),
                      static_cast<unsigned>(b / (1ull * g.x * g.y))};
    // Each block's order of threads from the launch's seed and its index alone, whichever host
    // thread runs it.
    run.schedule = grid.seed ^ ((b + 1) * 0x94d049bb133111ebull);
    if (run.schedule == 0) run.schedule = 1;
    try {
      run_block(run, index);
    } catch (...) {
      grid.fail(std::current_exception());
    }
    grid.block_finished();
  }
  active = nullptr;
  current_position = nullptr;
}

/// The host threads that run a launch's blocks beside the launching thread: resident_blocks - 1 of
/// them, started with the first launch of more than one block, each waiting for the next launch.
class helper_threads {
 public:
  /// Runs `grid`'s blocks on the calling thread and `helpers` of these, and returns when all are
  /// done. The blocks are taken only once every helper is ready, so that the first ones run side
  /// by side rather than before the helpers wake.
  void run(grid_run& grid, unsigned helpers) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (helpers != 0) {
      while (threads_.size() < helpers) {  // may throw: no job is handed out yet
        const auto index = static_cast<unsigned>(threads_.size());
        threads_.emplace_back([this, index] { serve(index); });
      }
      job_ = &grid;
      helpers_ = busy_ = helpers;
      ready_ = 0;
      ++job_number_;
      wake_.notify_all();
      idle_.wait(lock, [&] { return ready_ == helpers; });
    }
    lock.unlock();
    run_blocks(grid);
    lock.lock();
    idle_.wait(lock, [&] { return busy_ == 0; });
  }

  ~helper_threads() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      wake_.notify_all();
    }
    for (std::thread& t : threads_) t.join();
  }

 private:
  void serve(unsigned index) {
    std::uint64_t served = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || job_number_ != served; });
      if (stopping_) return;
      served = job_number_;
      if (index >= helpers_) continue;
      grid_run& grid = *job_;
      if (++ready_ == helpers_) idle_.notify_all();
      lock.unlock();
      run_blocks(grid);
      lock.lock();
      if (--busy_ == 0) idle_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::vector<std::thread> threads_;
  grid_run* job_ = nullptr;
  std::uint64_t job_number_ = 0;
  unsigned helpers_ = 0, busy_ = 0, ready_ = 0;
  bool stopping_ = false;
};

helper_threads& block_helpers() {
  static helper_threads helpers;
  return helpers;
}

}  // namespace

constinit thread_local const thread_position* current_position = nullptr;

void sync_block() { wait_at(active->block); }

warp_values collective(const char* intrinsic, unsigned mask, std::uint64_t value) {
  if (mask != 0xffffffffu) {
    std::fprintf(stderr, "emulated CUDA: %s with mask %#x: only full warps are emulated\n",
                 intrinsic, mask);
    std::abort();
  }
  fiber& f = running_fiber();
  warp& w = active->warps[f.warp];
  const unsigned buffer = w.buffer;
  w.values[buffer][f.lane] = value;
  w.taking_part |= 1u << f.lane;
  if (w.sync.arrived + 1 == w.sync.expected) w.complete_round();
  wait_at(w.sync);
  warp_values got;
  got.taking_part = w.took_part[buffer];
  for (unsigned lane = 0; lane < 32; ++lane)
    got.of_lane[lane] = (got.taking_part >> lane) & 1u ? w.values[buffer][lane] : 0;
  return got;
}

void sync_grid() {
  // The block's last thread to arrive waits for the other blocks, holding the rest of the block
  // (its host thread) until they have all arrived.
  if (wait_at(active->block) && !active->grid->wait_at_barrier())
    stop_block("stopped: the launch failed");
  sync_block();
}

void yield_spinning() {
  fiber& f = running_fiber();
  if (active->grid->failed) stop_block("stopped: the launch failed");
  const auto now = std::chrono::steady_clock::now();
  if (!f.spinning_since) f.spinning_since = now;
  if (now - *f.spinning_since > spin_limit) stop_block("spins forever at __nanosleep");
  std::this_thread::yield();  // the block it waits for may need this core
  switch_away(true);
}

void copy_16_bytes_later(void* to, const void* from) {
  running_fiber().pending_copies.emplace_back(to, from);
}

void complete_copies() {
  fiber& f = running_fiber();
  for (const auto& [to, from] : f.pending_copies) std::memcpy(to, from, 16);
  f.pending_copies.clear();
}

void* dynamic_shared_memory() {
  running_fiber();
  return active->shared.data();
}

cudaError_t run_grid(dim3 grid, dim3 block, std::size_t shared_bytes,
                     const std::function<void()>& body, bool cooperative) {
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  const unsigned long long blocks = 1ull * grid.x * grid.y * grid.z;
  if (blocks == 0 || threads == 0 || threads > 1024 || shared_bytes > shared_bytes_per_block)
    return record(cudaErrorInvalidConfiguration);  // as a launch does: nothing runs
  if (cooperative && blocks > resident_blocks) return record(cudaErrorCooperativeLaunchTooLarge);
  const std::lock_guard<std::mutex> lock(launch_mutex);
  static std::uint64_t launches = 0;  // under the lock
  grid_run run;
  run.grid = grid;
  run.block = block;
  run.shared_bytes = shared_bytes;
  run.body = &body;
  run.seed = schedule_seed() ^ (++launches * 0xbf58476d1ce4e5b9ull);
  run.blocks = blocks;
  run.cooperative = cooperative;
  const auto helpers =
      static_cast<unsigned>(std::min<unsigned long long>(blocks, resident_blocks) - 1);
  block_helpers().run(run, helpers);
  if (run.failure) std::rethrow_exception(run.failure);
  return cudaSuccess;
}

}  // namespace dropit_emulation

// ---------------------------------------------------------------------------------------------
// The CUDA runtime, emulated: one device, 0, whose memory is host memory from cudaMalloc.

namespace {

std::mutex allocations_mutex;                       // guards what follows
std::map<std::uintptr_t, std::size_t> allocations;  // device memory: start -> bytes asked for
// Freed device memory by its rounded size, handed out again as a caching allocator does: the tests
// allocate and free workspaces of tens of MiB per call (cuBLAS's alone is 32 MiB on an H100),
// whose pages would otherwise be mapped and faulted in afresh each time.
std::multimap<std::size_t, void*> freed;

std::size_t rounded_size(std::size_t bytes) {
  return (std::max<std::size_t>(bytes, 1) + 255) / 256 * 256;
}

/// The allocation holding `pointer`, if any: its start and the bytes asked for.
std::optional<std::pair<std::uintptr_t, std::size_t>> allocation_of(const void* pointer) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  const std::lock_guard<std::mutex> lock(allocations_mutex);
  auto it = allocations.upper_bound(address);
  if (it == allocations.begin()) return std::nullopt;
  --it;
  if (address >= it->first + std::max<std::size_t>(it->second, 1)) return std::nullopt;
  return *it;
}

}  // namespace

bool dropit_emulation::in_one_allocation(const void* pointer, std::size_t bytes) {
  if (bytes == 0) return true;
  const auto allocation = allocation_of(pointer);
  return allocation && reinterpret_cast<std::uintptr_t>(pointer) + bytes <=
                           allocation->first + allocation->second;
}

extern "C" {

cudaError_t cudaMalloc(void** pointer, size_t bytes) {
  const std::size_t rounded = rounded_size(bytes);
  *pointer = nullptr;
  {
    const std::lock_guard<std::mutex> lock(allocations_mutex);
    if (const auto reused = freed.find(rounded); reused != freed.end()) {
      *pointer = reused->second;
      freed.erase(reused);
    }
  }
  if (*pointer == nullptr) *pointer = std::aligned_alloc(256, rounded);
  if (*pointer == nullptr) return record(cudaErrorMemoryAllocation);
  std::memset(*pointer, 0x5a, rounded);  // device memory is not zeroed either
  const std::lock_guard<std::mutex> lock(allocations_mutex);
  allocations[reinterpret_cast<std::uintptr_t>(*pointer)] = bytes;
  return cudaSuccess;
}

cudaError_t cudaFree(void* pointer) {
  if (pointer == nullptr) return cudaSuccess;
  const std::lock_guard<std::mutex> lock(allocations_mutex);
  const auto allocation = allocations.find(reinterpret_cast<std::uintptr_t>(pointer));
  if (allocation == allocations.end()) return record(cudaErrorInvalidValue);
  freed.emplace(rounded_size(allocation->second), pointer);
  allocations.erase(allocation);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* to, const void* from, size_t bytes, cudaMemcpyKind) {
  if (bytes != 0) std::memmove(to, from, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* pointer, int value, size_t bytes) {
  if (bytes != 0) std::memset(pointer, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* pointer, int value, size_t bytes, cudaStream_t) {
  return cudaMemset(pointer, value, bytes);
}

cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) {
  *stream = reinterpret_cast<cudaStream_t>(new int(0));
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete reinterpret_cast<int*>(stream);
  return cudaSuccess;
}

cudaError_t cudaGetLastError() { return std::exchange(last_error, cudaSuccess); }
cudaError_t cudaPeekAtLastError() { return last_error; }
const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorCooperativeLaunchTooLarge:
      return "cudaErrorCooperativeLaunchTooLarge";
    default:
      return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t error) { return cudaGetErrorName(error); }

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : record(cudaErrorInvalidDevice);
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* properties, int device) {
  if (device != 0) return record(cudaErrorInvalidDevice);
  *properties = cudaDeviceProp{};
  std::snprintf(properties->name, sizeof properties->name, "CPU emulation of a CUDA device");
  properties->major = 9;
  properties->minor = 0;
  properties->multiProcessorCount = static_cast<int>(dropit_emulation::resident_blocks);
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
  if (device != 0) return record(cudaErrorInvalidDevice);
  switch (attribute) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(shared_bytes_per_block);
      return cudaSuccess;
    case cudaDevAttrCooperativeLaunch:
      *value = 1;
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = static_cast<int>(dropit_emulation::resident_blocks);
      return cudaSuccess;
    case cudaDevAttrPageableMemoryAccess:
      *value = 0;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      return cudaSuccess;
    default:
      return record(cudaErrorInvalidValue);
  }
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* pointer) {
  *attributes = cudaPointerAttributes{};
  if (allocation_of(pointer)) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->device = 0;
    attributes->devicePointer = const_cast<void*>(pointer);
  } else {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
  }
  return cudaSuccess;
}

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attributes, const void*) {
  *attributes = cudaFuncAttributes{};
  attributes->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) { return cudaSuccess; }
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void*, int, size_t) {
  *blocks = 1;  // on each of resident_blocks multiprocessors
  return cudaSuccess;
}

}  // extern "C"
