// The doorbell's knobs, and the phases and states its worker goes through.
#pragma once

#include <cstdint>

#include "fastpath/device.hpp"

namespace fastpath::hostdispatch {

struct DoorbellOptions {
  std::uint32_t max_slots = 1024;
  // With callbacks outstanding but none arriving for this long, poll every backoff_poll_ns
  // instead of spinning (a long kernel ahead of the callback, or a replay announced in error).
  std::int64_t spin_budget_ns = 10'000'000;
  std::int64_t backoff_poll_ns = 50'000;
  // Idle but with live graphs: look for replays nobody announced this often.
  std::int64_t safety_poll_ns = 5'000'000;
  Ring ring = Ring::Auto;
  // The queue ring's entries (a power of two): how far streams may run ahead of the worker.
  std::uint32_t queue_entries = 4096;
  // Launch the queue kernel with programmatic dependent launch where the GPU has it (sm_90 on).
  bool programmatic_launch = true;
};

enum class Phase : int {
  Active,      // serving; launches accepted
  Detached,    // the owner is gone: serve what is pending and what live graphs fire, then exit
  Closing,     // shutdown: serve what is pending, within the bound
  Discarding,  // shut down: answer requests without running callbacks, until no graph holds a flag
};

enum class WorkerState : int { Starting, Sleeping, Spinning, Backoff, Discarding, Exited };

inline const char* name_of(WorkerState s) {
  switch (s) {
    case WorkerState::Starting: return "starting";
    case WorkerState::Sleeping: return "sleeping";
    case WorkerState::Spinning: return "spinning";
    case WorkerState::Backoff: return "backoff";
    case WorkerState::Discarding: return "discarding";
    case WorkerState::Exited: return "exited";
  }
  return "?";
}

}  // namespace fastpath::hostdispatch
