// The interface every dispatch backend implements, its counters, and what a shutdown reports.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fastpath/callback.hpp"
#include "fastpath/device.hpp"
#include "fastpath/dispatch_mode.hpp"

namespace fastpath::hostdispatch {

struct Counters {
  std::atomic<std::int64_t> launched{0};
  std::atomic<std::int64_t> completed{0};
  std::atomic<std::int64_t> discarded{0};    // reached after shutdown, answered without running
  std::atomic<std::int64_t> unannounced{0};  // graph callbacks that fired with no replay announced
  std::atomic<std::int64_t> outstanding_eager{0};
  std::atomic<std::int64_t> outstanding_graph{0};  // announced by replays, not yet run
};

// Decrements a counter that must not go below zero; false when it was already zero.
inline bool decrement_if_positive(std::atomic<std::int64_t>& counter) {
  std::int64_t v = counter.load(std::memory_order_acquire);
  while (v > 0) {
    if (counter.compare_exchange_weak(v, v - 1, std::memory_order_acq_rel)) return true;
  }
  return false;
}

// Adds n (possibly negative) without going below zero.
inline void add_clamped(std::atomic<std::int64_t>& counter, std::int64_t n) {
  std::int64_t v = counter.load();
  while (!counter.compare_exchange_weak(v, std::max<std::int64_t>(0, v + n))) {
  }
}

struct BackendStats {
  std::int64_t launched = 0, completed = 0, discarded = 0, unannounced = 0;
  std::int64_t outstanding_eager = 0, outstanding_graph = 0;
  std::int64_t graph_callbacks_alive = 0;  // captured callbacks held by live graphs
  // Doorbell only.
  std::int64_t slots_in_use = 0, slot_limit = 0, stream_slots = 0, graph_slots = 0;
  std::string worker_state = "none";
  std::int64_t worker_cpu_ns = 0, worker_wakeups = 0, worker_os_id = 0;
  std::string ring = "none", ring_reason;  // how streams ring the doorbell (device.hpp)
  bool posts = false;  // a posted callback lets its stream go on (the doorbell's queue ring)
};

struct ShutdownOutcome {
  bool drained = false;                // everything launched or announced ran within the bound
  std::vector<CallbackPtr> not_run;    // eager callbacks that will not run
  std::int64_t graph_callbacks_not_run = 0;  // announced replays' callbacks that will not run
  std::int64_t graph_callbacks_alive = 0;    // held by live graphs: their replays are answered, not run
  std::int64_t still_running = 0;            // callbacks that had not returned when the bound ran out
  double waited_s = 0;
};

class BackendImpl {
 public:
  virtual ~BackendImpl() = default;
  virtual Backend kind() const = 0;
  // Both are called without the GIL.
  virtual Status launch(StreamHandle stream, CallbackPtr cb) = 0;
  virtual Status launch_captured(StreamHandle stream, CallbackPtr cb) = 0;
  // A replay will fire this many captured callbacks (negative: a replay that did not happen).
  virtual void announce(std::int64_t callbacks) = 0;
  // Waits up to `bound` for pending callbacks, then stops running callbacks. Idempotent.
  virtual ShutdownOutcome shutdown(std::chrono::nanoseconds bound) = 0;
  // The owner is gone: keep serving what is pending and what live graphs fire, then stop.
  virtual void detach() = 0;
  virtual BackendStats stats() const = 0;
  // After a stream synchronize: until the posted callbacks launched or announced so far have run.
  virtual void wait_posted() {}
};

// Stops every backend's callbacks before the interpreter finalizes (an atexit hook calls it).
class Stoppable {
 public:
  virtual ~Stoppable() = default;
  virtual void stop_at_exit(std::chrono::nanoseconds bound) = 0;
};

class ExitRegistry {
 public:
  static ExitRegistry& instance() {
    static ExitRegistry* registry = new ExitRegistry();  // never destroyed: used until exit
    return *registry;
  }
  void add(const std::shared_ptr<Stoppable>& s) {
    std::lock_guard<std::mutex> lock(mu_);
    items_.erase(std::remove_if(items_.begin(), items_.end(), [](auto& w) { return w.expired(); }),
                 items_.end());
    items_.push_back(s);
  }
  // One bound for all of them together. Runs at interpreter exit.
  void stop_all(std::chrono::nanoseconds bound) {
    process_exiting().store(true);
    std::vector<std::weak_ptr<Stoppable>> items;
    {
      std::lock_guard<std::mutex> lock(mu_);
      items.swap(items_);
    }
    const auto deadline = std::chrono::steady_clock::now() + bound;
    for (auto& w : items) {
      auto s = w.lock();
      if (!s) continue;
      const auto left = deadline - std::chrono::steady_clock::now();
      s->stop_at_exit(std::max(std::chrono::nanoseconds(0), std::chrono::duration_cast<std::chrono::nanoseconds>(left)));
    }
  }

 private:
  std::mutex mu_;
  std::vector<std::weak_ptr<Stoppable>> items_;
};

}  // namespace fastpath::hostdispatch
