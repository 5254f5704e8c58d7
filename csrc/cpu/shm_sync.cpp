// Barrier of the shared-memory transport, with acquire/release atomics.
// Reference (pure Python, x86-64 only): exogym/ops/sync.py.
//
// Each rank owns one 64-byte line of int64 words in the shared segment (flags [world, 8]):
//   word 0: (generation << 32) | (tag << 16) | group key      -- stored with release order
//   word 1: ((generation & 0xFFFF) << 48) | payload bytes      -- stored before word 0
//   words 2..4: this rank's own mismatch report (other rank, its word 0, its word 1)
// Rank 0's words 5 and 6 are shared by all: a wake counter and the number of sleeping waiters.
// A rank that has waited a while sleeps on the counter (a futex on Linux) instead of taking a
// core from the peers it waits for; an arriving rank wakes the sleepers.
// A rank arrives by storing words 1 then 0; it has passed when every rank's generation is at
// least its own. Packing the generation into each word lets a reader tell a word of this
// barrier from one of the next barrier (a rank that already passed), without a lock.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <sched.h>
#include <time.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace exogym {
namespace {

constexpr int64_t kWords = 8;
constexpr int64_t kSizeMask = (int64_t(1) << 48) - 1;

inline uint32_t* wake_word(int64_t* f) { return reinterpret_cast<uint32_t*>(f + 5); }
inline int64_t* waiters_word(int64_t* f) { return f + 6; }

// Sleep until the wake counter moves past `seen`, or `us` microseconds pass.
void sleep_on(int64_t* f, uint32_t seen, int64_t us) {
#if defined(__linux__)
  struct timespec ts = {static_cast<time_t>(us / 1000000), static_cast<long>((us % 1000000) * 1000)};
  syscall(SYS_futex, wake_word(f), FUTEX_WAIT, seen, &ts, nullptr, 0);
#else
  (void)f;
  (void)seen;
  struct timespec ts = {0, 50000};
  nanosleep(&ts, nullptr);
#endif
}

void wake_sleepers(int64_t* f) {
  __atomic_fetch_add(wake_word(f), 1u, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(waiters_word(f), __ATOMIC_SEQ_CST) > 0) {
#if defined(__linux__)
    syscall(SYS_futex, wake_word(f), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
#endif
  }
}

inline int64_t load_acquire(const int64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline void store_release(int64_t* p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
inline void store_relaxed(int64_t* p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

int64_t* check_flags(const at::Tensor& flags, int64_t rank) {
  TORCH_CHECK(flags.device().is_cpu() && flags.scalar_type() == at::kLong && flags.is_contiguous() &&
                  flags.dim() == 2 && flags.size(1) == kWords,
              "shm_barrier: flags must be a contiguous CPU int64 tensor of shape [world, 8], got ",
              flags.sizes(), " ", flags.scalar_type());
  TORCH_CHECK(rank >= 0 && rank < flags.size(0), "shm_barrier: rank ", rank, " out of range for world ",
              flags.size(0));
  return flags.data_ptr<int64_t>();
}

// Returns -1 when every rank arrived with the same tag (and, within `rank`'s group, the same
// size), -2 on timeout, or the rank whose tag or size disagreed (details in words 2..4 of the
// caller's line).
int64_t wait_all(int64_t* f, int64_t world, int64_t rank, int64_t gen, int64_t word0, int64_t size,
                 double timeout_s, int64_t spin_us) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(timeout_s);
  const int64_t tag = (word0 >> 16) & 0xFFFF, group = word0 & 0xFFFF;
  int64_t next = 0;  // ranks below `next` are known to have arrived
  uint64_t spins = 0;
  while (true) {
    while (next < world) {
      const int64_t* line = f + next * kWords;
      const int64_t w0 = load_acquire(line);
      const int64_t g = static_cast<int64_t>(static_cast<uint64_t>(w0) >> 32);
      if (g < gen) break;
      if (g == gen) {
        const int64_t other_tag = (w0 >> 16) & 0xFFFF, other_group = w0 & 0xFFFF;
        const int64_t w1 = load_acquire(line + 1);
        const bool same_barrier = ((static_cast<uint64_t>(w1) >> 48) & 0xFFFF) == (static_cast<uint64_t>(gen) & 0xFFFF);
        bool bad = other_tag != tag;
        if (!bad && same_barrier && other_group == group) bad = (w1 & kSizeMask) != size;
        if (bad) {
          int64_t* mine = f + rank * kWords;
          store_relaxed(mine + 2, next);
          store_relaxed(mine + 3, w0);
          store_relaxed(mine + 4, w1);
          return next;
        }
      }
      // g > gen: that rank already passed this barrier, having checked this rank's words.
      ++next;
    }
    if (next == world) return -1;
    ++spins;
    if (spins < 256) {
      cpu_relax();
      continue;
    }
    if ((spins & 63) == 0) {
      const auto now = std::chrono::steady_clock::now();
      if (now > deadline) return -2;
      if (now - start > std::chrono::microseconds(spin_us)) {
        // Sleep on the wake counter. Every step is sequentially consistent, so an arrival is
        // either seen by the re-check below or moves the counter before the futex reads it.
        __atomic_fetch_add(waiters_word(f), 1, __ATOMIC_SEQ_CST);
        const uint32_t seen = __atomic_load_n(wake_word(f), __ATOMIC_SEQ_CST);
        const int64_t line = next * kWords;
        const bool still = static_cast<int64_t>(static_cast<uint64_t>(__atomic_load_n(f + line, __ATOMIC_SEQ_CST)) >> 32) < gen;
        if (still) {
          const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now).count();
          sleep_on(f, seen, std::max<int64_t>(1, std::min<int64_t>(left, 100000)));
        }
        __atomic_fetch_sub(waiters_word(f), 1, __ATOMIC_SEQ_CST);
        continue;
      }
    }
    sched_yield();
  }
}

int64_t shm_barrier_cpu(at::Tensor& flags, int64_t rank, int64_t gen, int64_t tag, int64_t group, int64_t size,
                        double timeout_s, int64_t spin_us) {
  int64_t* f = check_flags(flags, rank);
  TORCH_CHECK(gen > 0 && gen < (int64_t(1) << 31), "shm_barrier: generation out of range: ", gen);
  TORCH_CHECK(tag >= 0 && tag < 0x10000 && group >= 0 && group < 0x10000,
              "shm_barrier: tag and group must fit 16 bits");
  TORCH_CHECK(size >= 0 && size <= kSizeMask, "shm_barrier: size out of range: ", size);
  const int64_t world = flags.size(0);
  const int64_t word0 = (gen << 32) | (tag << 16) | group;
  int64_t* mine = f + rank * kWords;
  store_relaxed(mine + 1, ((gen & 0xFFFF) << 48) | size);
  __atomic_store_n(mine, word0, __ATOMIC_SEQ_CST);  // release, and ordered before the wake below
  wake_sleepers(f);
  // torch.ops calls from Python release the GIL around the kernel, so the node's other threads
  // (its watchdog) run while this waits.
  return wait_all(f, world, rank, gen, word0, size, timeout_s, spin_us);
}

}  // namespace

TORCH_LIBRARY_IMPL(exogym, CPU, m) { m.impl("shm_barrier", &shm_barrier_cpu); }

}  // namespace exogym
