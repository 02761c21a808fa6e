// The doorbell's shared state and its host worker. The worker spins only while callbacks are
// outstanding (launched, or announced by a graph replay, and not yet run) and sleeps otherwise.
// Launches, graphs' destructors and shutdown talk to it through atomics and one wake-up mutex.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "fastpath/backend.hpp"
#include "fastpath/doorbell_options.hpp"
#include "fastpath/doorbell_slots.hpp"
#include "fastpath/spin_util.hpp"

namespace fastpath::hostdispatch {

class DoorbellState final : public Stoppable {
 public:
  DoorbellState(std::shared_ptr<Device> device, DoorbellOptions opts)
      : device_(device), opts_(opts), table_(std::move(device), opts.max_slots) {}

  ~DoorbellState() override {
    if (queue_.host.host != nullptr) device_->free_queue(queue_);
  }

  Status init() {
    ring_ = device_->choose_ring(opts_.ring);
    Status st = table_.init();
    if (!st.ok() || ring_.ring != Ring::Queue) return st;
    st = device_->alloc_queue(opts_.queue_entries, &queue_);
    if (!st.ok()) return st;
    entries_ = static_cast<std::atomic<std::uint64_t>*>(queue_.host.host);
    consumed_ = new (queue_.consumed_host()) std::atomic<std::uint32_t>(0);
    table_.set_idle_flag(consumed_);
    return st;
  }

  // The stream goes on past a posted callback only on the queue ring; every other ring waits.
  bool posts() const { return consumed_ != nullptr; }

  // ---- launch side (no GIL) ----

  Status launch_eager(StreamHandle stream, CallbackPtr cb) {
    if (phase() != Phase::Active) return Status::failure("host dispatch is shut down");
    const bool waits = !cb->posted();
    std::uint32_t i = 0;
    Status st = table_.stream_slot(stream, &i);
    if (!st.ok()) return st;
    SlotInfo& slot = table_.info(i);
    const std::uint64_t addr = table_.device_addr(i);
    std::lock_guard<std::mutex> order(slot.launch_mu);
    {
      std::lock_guard<std::mutex> lock(slot.fifo_mu);
      // Checked again under the queue's lock: a shutdown switches phase holding every queue's lock.
      if (phase() != Phase::Active) return Status::failure("host dispatch is shut down");
      slot.fifo.push_back(std::move(cb));
    }
    c_.launched.fetch_add(1, std::memory_order_relaxed);
    c_.outstanding_eager.fetch_add(1);  // seq_cst: pairs with the worker's sleeping_ store
    wake_if_sleeping();
    bool requested = false;
    st = ring(stream, i, addr, waits, &requested);
    if (!requested) {  // never requested, so the worker cannot have taken it: take it back
      CallbackPtr undone;
      {
        std::lock_guard<std::mutex> lock(slot.fifo_mu);
        undone = std::move(slot.fifo.back());
        slot.fifo.pop_back();
      }
      c_.outstanding_eager.fetch_sub(1);
      c_.launched.fetch_sub(1, std::memory_order_relaxed);
      return st;
    }
    if (!st.ok()) {
      return Status::failure(st.error + " (the callback will still run, but the stream does not wait for it)");
    }
    return st;
  }

  Status launch_captured(StreamHandle stream, CallbackPtr cb) {
    if (phase() != Phase::Active) return Status::failure("host dispatch is shut down");
    const bool waits = !cb->posted();
    std::uint32_t i = 0;
    Status st = table_.graph_slot(std::move(cb), &i);
    if (!st.ok()) return st;
    st = device_->retain_in_capture(stream, std::make_unique<SlotLease>(this, i));
    if (!st.ok()) return st;  // the lease died with the failure and gave the slot back
    wake_if_sleeping();       // a worker asleep with no graph alive starts polling for unannounced replays
    const std::uint64_t addr = table_.device_addr(i);
    bool requested = false;
    st = ring(stream, i, addr, waits, &requested);
    if (st.ok()) c_.launched.fetch_add(1, std::memory_order_relaxed);
    return st;  // on failure the graph still owns the slot and gives it back when destroyed
  }

  // After a stream synchronize: its posted callbacks are all written in the queue by now, so wait
  // until the worker has served everything written so far (not what other streams add later).
  void wait_posted() {
    if (!posts() || !posted_seen_.load(std::memory_order_acquire)) return;
    const std::uint32_t horizon = written_horizon(consumed_->load(std::memory_order_acquire));
    while (static_cast<std::int32_t>(consumed_->load(std::memory_order_acquire) - horizon) < 0 &&
           phase() != Phase::Discarding && !worker_exited()) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  void announce(std::int64_t callbacks) {
    add_clamped(c_.outstanding_graph, callbacks);
    if (callbacks > 0) wake_if_sleeping();
  }

  // Any thread: a graph holding slot i is gone.
  // The worker frees slots under release_mu_, so unlocking it is the caller's last touch of this
  // state: the worker may exit and destroy it right after.
  void request_release(std::uint32_t i) {
    std::lock_guard<std::mutex> lock(release_mu_);
    releases_.push_back(i);
    release_pending_.store(true, std::memory_order_release);
    wake_always();
  }

  void detach() {
    Phase expected = Phase::Active;
    if (phase_.compare_exchange_strong(expected, Phase::Detached)) wake_always();
  }

  // Serve what is pending until the bound, then answer everything without running it.
  ShutdownOutcome shutdown(std::chrono::nanoseconds bound) {
    std::lock_guard<std::mutex> once(shutdown_mu_);
    ShutdownOutcome out;
    const std::int64_t start = now_ns();
    if (phase() != Phase::Discarding) {
      phase_.store(Phase::Closing);
      wake_always();
      const std::int64_t deadline = start + bound.count();
      while (outstanding() > 0 && now_ns() < deadline) std::this_thread::sleep_for(std::chrono::microseconds(100));
      out.not_run = discard_from_now_on();
      out.graph_callbacks_not_run = c_.outstanding_graph.exchange(0);
    }
    out.graph_callbacks_alive = table_.graph_slots();
    out.drained = out.not_run.empty() && out.graph_callbacks_not_run == 0;
    out.waited_s = static_cast<double>(now_ns() - start) * 1e-9;
    return out;
  }

  void stop_at_exit(std::chrono::nanoseconds bound) override { shutdown(bound); }

  bool worker_exited() const { return state_.load() == WorkerState::Exited; }

  bool wait_worker_exit(std::int64_t deadline_ns) {
    std::unique_lock<std::mutex> lock(exit_mu_);
    while (!worker_exited()) {
      const std::int64_t left = deadline_ns - now_ns();
      if (left <= 0) return false;
      exit_cv_.wait_for(lock, std::chrono::nanoseconds(left));
    }
    return true;
  }

  BackendStats stats() const {
    BackendStats s;
    s.launched = c_.launched.load();
    s.completed = c_.completed.load();
    s.discarded = c_.discarded.load();
    s.unannounced = c_.unannounced.load();
    s.outstanding_eager = c_.outstanding_eager.load();
    s.outstanding_graph = c_.outstanding_graph.load();
    const SlotTable::Usage u = table_.usage();
    s.graph_callbacks_alive = u.graphs;
    s.slots_in_use = u.in_use;
    s.stream_slots = u.streams;
    s.graph_slots = u.graphs;
    s.slot_limit = table_.limit();
    s.worker_state = name_of(state_.load());
    s.worker_cpu_ns = worker_cpu_ns_.load();
    s.worker_wakeups = wakeups_.load();
    s.worker_os_id = worker_os_id_.load();
    s.ring = name_of(ring_.ring);
    s.ring_reason = ring_.reason;
    s.posts = posts();
    return s;
  }

  // ---- the worker ----

  static void worker_main(std::shared_ptr<DoorbellState> self) { self->run_worker(); }

 private:
  class SlotLease final : public GraphOwned {
   public:
    SlotLease(DoorbellState* state, std::uint32_t slot) : state_(state), slot_(slot) {}
    ~SlotLease() override { state_->request_release(slot_); }

   private:
    // Not an owner: CUDA runs this destructor on a thread of its own, where the last owner's
    // cudaFreeHost would be a CUDA call from a CUDA callback (seen on the H200 as a later pinned
    // allocation failing with "invalid argument"). The state outlives every lease anyway: its
    // worker exits only once no graph holds a slot, and only the worker frees a graph's slot.
    DoorbellState* state_;
    std::uint32_t slot_;
  };

  Phase phase() const { return phase_.load(std::memory_order_acquire); }

  Status ring(StreamHandle stream, std::uint32_t i, std::uint64_t addr, bool waits, bool* requested) {
    if (!posts()) return device_->ring(stream, addr, kFlagRequested, kFlagServed, ring_.ring, requested);
    if (!waits) posted_seen_.store(true, std::memory_order_release);
    const Status st = device_->ring_queue(stream, queue_, i, waits, addr, opts_.programmatic_launch);
    *requested = st.ok();  // one launch: it either claims or never runs
    return st;
  }
  std::int64_t outstanding() const { return c_.outstanding_eager.load() + c_.outstanding_graph.load(); }

  void wake_if_sleeping() {
    if (sleeping_.load()) wake_always();
  }
  void wake_always() {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_cv_.notify_one();
  }

  // Switches to Discarding with every stream queue locked, so each queued callback either ran
  // before the switch or is in the returned list: the report is exact.
  std::vector<CallbackPtr> discard_from_now_on() {
    std::vector<std::unique_lock<std::mutex>> locks;
    std::vector<std::uint32_t> streams;
    const std::uint32_t n = table_.high_water();
    for (std::uint32_t i = 0; i < n; ++i) {
      if (table_.info(i).kind.load(std::memory_order_acquire) != static_cast<int>(SlotKind::Stream)) continue;
      locks.emplace_back(table_.info(i).fifo_mu);
      streams.push_back(i);
    }
    phase_.store(Phase::Discarding);
    std::vector<CallbackPtr> queued;
    for (std::uint32_t i : streams) {
      for (const CallbackPtr& cb : table_.info(i).fifo) queued.push_back(cb);
    }
    locks.clear();
    wake_always();
    return queued;
  }

  bool nothing_left() const {
    return table_.graph_slots() == 0 && c_.outstanding_eager.load() == 0 &&
           !release_pending_.load(std::memory_order_acquire);
  }

  void set_state(WorkerState s) {
    if (state_.load(std::memory_order_relaxed) != s) {
      worker_cpu_ns_.store(this_thread_cpu_ns(), std::memory_order_relaxed);
      state_.store(s);
    }
  }

  void run_worker() {
    worker_os_id_.store(this_thread_os_id());
    std::int64_t last_progress = now_ns();
    bool lingering = false;  // after a replay nobody announced: spin a while for the rest of it
    std::uint32_t spins = 0;
    for (;;) {
      if (release_pending_.load(std::memory_order_acquire)) apply_releases();
      if (!deferred_.empty()) free_deferred();
      const Phase ph = phase();
      if (ph == Phase::Discarding) {
        set_state(WorkerState::Discarding);
        scan(true);
        if (nothing_left()) break;
        sleep(ph, /*wake_on_outstanding=*/false, opts_.backoff_poll_ns * 4, /*poll_only_with_graphs=*/false);
        continue;
      }
      if (outstanding() > 0 || lingering) {
        if (scan(false)) {
          last_progress = now_ns();
          set_state(WorkerState::Spinning);
          continue;
        }
        if ((++spins & 63U) == 0) {
          const std::int64_t quiet = now_ns() - last_progress;
          if (lingering && quiet > opts_.spin_budget_ns) lingering = false;
          if (!lingering && opts_.spin_budget_ns > 0 && quiet > opts_.spin_budget_ns) {
            set_state(WorkerState::Backoff);
            std::this_thread::sleep_for(std::chrono::nanoseconds(opts_.backoff_poll_ns));
            continue;
          }
          if ((spins & 0xFFFFU) == 0) worker_cpu_ns_.store(this_thread_cpu_ns(), std::memory_order_relaxed);
        }
        set_state(WorkerState::Spinning);
        cpu_relax();
        continue;
      }
      if (!deferred_.empty()) {  // a claim still being written holds back a released slot
        set_state(WorkerState::Spinning);
        std::this_thread::yield();
        continue;
      }
      if (ph == Phase::Detached && nothing_left()) break;
      set_state(WorkerState::Sleeping);
      const bool graphs_alive = sleep(ph, /*wake_on_outstanding=*/true, opts_.safety_poll_ns, /*poll_only_with_graphs=*/true);
      if (graphs_alive && outstanding() == 0 && scan(false)) lingering = true;
      last_progress = now_ns();
    }
    worker_cpu_ns_.store(this_thread_cpu_ns());
    {
      std::lock_guard<std::mutex> lock(exit_mu_);
      state_.store(WorkerState::Exited);
    }
    exit_cv_.notify_all();
  }

  // Sleeps until woken, or until poll_ns passes (with poll_only_with_graphs, only while a graph
  // holds a flag: then a replay nobody announced can still fire). Returns whether one did.
  bool sleep(Phase seen, bool wake_on_outstanding, std::int64_t poll_ns, bool poll_only_with_graphs) {
    std::unique_lock<std::mutex> lock(wake_mu_);
    sleeping_.store(true);  // seq_cst: a launcher that then reads false must see our checks below
    const bool graphs_alive = table_.graph_slots() > 0;
    if (poll_only_with_graphs && !graphs_alive) poll_ns = 0;
    auto woken = [&] {
      return (wake_on_outstanding && outstanding() > 0) || release_pending_.load() || phase() != seen ||
             (table_.graph_slots() > 0) != graphs_alive;
    };
    if (!woken()) {
      if (poll_ns > 0) {
        wake_cv_.wait_for(lock, std::chrono::nanoseconds(poll_ns), woken);
      } else {
        wake_cv_.wait(lock, woken);
      }
    }
    sleeping_.store(false);
    wakeups_.fetch_add(1, std::memory_order_relaxed);
    return graphs_alive;
  }

  bool scan(bool discard) {
    if (posts()) return drain_queue(discard);
    bool any = false;
    const std::uint32_t n = table_.high_water();
    for (std::uint32_t i = 0; i < n; ++i) {
      if (table_.line(i).state.load(std::memory_order_acquire) != kFlagRequested) continue;
      serve(i, discard, kFlagServed, true);
      any = true;
    }
    return any;
  }

  // Serves the queue in claim order, which is each stream's order.
  bool drain_queue(bool discard) {
    bool any = false;
    const std::uint32_t mask = queue_.entries - 1;
    for (;;) {
      const std::uint64_t entry = entries_[tail_ & mask].load(std::memory_order_acquire);
      const std::uint32_t seq = tail_ + 1;
      if (static_cast<std::uint32_t>(entry) != seq) return any;  // not written yet, or last lap's
      const auto word = static_cast<std::uint32_t>(entry >> 32);
      serve(word & ~kQueueWaits, discard, seq, (word & kQueueWaits) != 0);
      tail_ = seq;
      consumed_->store(seq, std::memory_order_release);
      any = true;
    }
  }

  // Runs slot i's next callback, then answers the stream with `answer` if it waits.
  void serve(std::uint32_t i, bool discard, std::uint32_t answer, bool waits) {
    SlotInfo& slot = table_.info(i);
    FlagLine& line = table_.line(i);
    const auto kind = static_cast<SlotKind>(slot.kind.load(std::memory_order_acquire));
    if (kind == SlotKind::Stream) {
      CallbackPtr cb;
      bool run = false;
      {
        std::lock_guard<std::mutex> lock(slot.fifo_mu);
        if (!slot.fifo.empty()) {
          cb = std::move(slot.fifo.front());
          slot.fifo.pop_front();
          run = phase() != Phase::Discarding;  // decided under the queue's lock: see discard_from_now_on
        }
      }
      if (cb && run) {
        cb->run(true);
        c_.completed.fetch_add(1, std::memory_order_relaxed);
      } else if (cb) {
        c_.discarded.fetch_add(1, std::memory_order_relaxed);
      } else {
        c_.unannounced.fetch_add(1, std::memory_order_relaxed);  // a request with nothing queued
      }
      if (waits) line.state.store(answer, std::memory_order_release);
      if (cb) c_.outstanding_eager.fetch_sub(1);
      return;  // cb is destroyed here, after the stream was let go
    }
    if (kind == SlotKind::Graph && !discard) {
      slot.fixed->run(false);
      c_.completed.fetch_add(1, std::memory_order_relaxed);
      if (waits) line.state.store(answer, std::memory_order_release);
      if (!decrement_if_positive(c_.outstanding_graph)) c_.unannounced.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    c_.discarded.fetch_add(1, std::memory_order_relaxed);
    if (waits) line.state.store(answer, std::memory_order_release);
  }

  void apply_releases() {
    std::vector<std::uint32_t> released;
    {
      std::lock_guard<std::mutex> lock(release_mu_);
      released.swap(releases_);
      release_pending_.store(false, std::memory_order_release);
    }
    if (posts()) {
      // A released graph's last replay is done, so its entries are all written; but one may sit
      // behind a claim another stream has not written yet. Free the slot only once the worker
      // has served everything written so far.
      if (released.empty()) return;
      drain_queue(phase() == Phase::Discarding);
      const std::uint32_t horizon = written_horizon(tail_);
      for (std::uint32_t i : released) deferred_.push_back({i, horizon});
      free_deferred();
      return;
    }
    for (std::uint32_t i : released) {
      // A graph is released only after its last replay completed, so this flag is quiet; a
      // request still here would be a stream left waiting, so answer it before letting go.
      if (!posts() && table_.line(i).state.load(std::memory_order_acquire) == kFlagRequested) {
        table_.line(i).state.store(kFlagServed, std::memory_order_release);
      }
      table_.free_graph_slot(i);  // drops the captured callback; a Python one defers its decref
    }
  }

  // The sequence number of the furthest entry written past `served`, or `served`: every entry
  // written by now has a number at or below it. Any thread; it only reads the queue.
  std::uint32_t written_horizon(std::uint32_t served) const {
    std::uint32_t horizon = served;
    const std::uint32_t mask = queue_.entries - 1;
    for (std::uint32_t j = 1; j <= queue_.entries; ++j) {
      const std::uint32_t seq = served + j;
      if (static_cast<std::uint32_t>(entries_[(seq - 1) & mask].load(std::memory_order_acquire)) == seq) horizon = seq;
    }
    return horizon;
  }

  void free_deferred() {
    drain_queue(phase() == Phase::Discarding);
    std::size_t kept = 0;
    for (const DeferredFree& d : deferred_) {
      if (static_cast<std::int32_t>(tail_ - d.horizon) >= 0) {
        table_.free_graph_slot(d.slot);
      } else {
        deferred_[kept++] = d;
      }
    }
    deferred_.resize(kept);
  }

  struct DeferredFree {
    std::uint32_t slot;
    std::uint32_t horizon;  // free once the worker has served up to here
  };

  std::shared_ptr<Device> device_;
  DoorbellOptions opts_;
  RingChoice ring_;
  SlotTable table_;
  QueueMemory queue_;  // the queue ring's; empty on the others
  std::atomic<std::uint64_t>* entries_ = nullptr;
  std::atomic<std::uint32_t>* consumed_ = nullptr;  // host-written, device-read: entries served
  std::uint32_t tail_ = 0;                          // the worker's copy of *consumed_
  std::vector<DeferredFree> deferred_;              // worker only
  std::atomic<bool> posted_seen_{false};
  Counters c_;
  std::atomic<Phase> phase_{Phase::Active};
  std::atomic<WorkerState> state_{WorkerState::Starting};
  std::atomic<bool> sleeping_{false};
  std::mutex wake_mu_;
  std::condition_variable wake_cv_;
  std::mutex release_mu_;
  std::vector<std::uint32_t> releases_;
  std::atomic<bool> release_pending_{false};
  std::mutex shutdown_mu_;
  std::mutex exit_mu_;
  std::condition_variable exit_cv_;
  std::atomic<std::int64_t> worker_cpu_ns_{0};
  std::atomic<std::int64_t> wakeups_{0};
  std::atomic<std::int64_t> worker_os_id_{0};
};

}  // namespace fastpath::hostdispatch
