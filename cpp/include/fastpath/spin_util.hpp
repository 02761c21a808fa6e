// Small helpers for threads that spin: a polite pause, a clock, and the CPU time a thread used.
#pragma once

#include <chrono>
#include <cstdint>
#include <ctime>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace fastpath::hostdispatch {

// Tells the core this is a spin-wait: saves power and yields to a sibling hyper-thread.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// CPU time used by the calling thread (0 where the platform cannot say).
inline std::int64_t this_thread_cpu_ns() {
#if defined(CLOCK_THREAD_CPUTIME_ID)
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0) {
    return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  }
#endif
  return 0;
}

// The kernel's id of the calling thread, so a benchmark can read /proc/self/task/<tid>/stat.
inline std::int64_t this_thread_os_id() {
#if defined(__linux__)
  return static_cast<std::int64_t>(syscall(SYS_gettid));
#else
  return 0;
#endif
}

}  // namespace fastpath::hostdispatch
