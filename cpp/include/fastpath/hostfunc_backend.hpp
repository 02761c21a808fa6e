// blocking (cudaLaunchHostFunc) and hostfunc_v2 (cudaLaunchHostFunc_v2 with cudaHostTaskSpinWait):
// the driver's own host-task thread runs the callback while the stream waits for it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "fastpath/backend.hpp"
#include "fastpath/spin_util.hpp"

namespace fastpath::hostdispatch {

class HostFuncShared;

// What the driver's host function receives: shared state outlives the backend, so a task that
// runs after its engine is gone still finds it.
struct HostFuncTask {
  std::shared_ptr<HostFuncShared> shared;
  CallbackPtr cb;
  bool captured = false;
  std::uint64_t seq = 0;  // launch order, for the shutdown report
};

class HostFuncShared final : public Stoppable {
 public:
  Counters c;

  // The host function both backends enqueue.
  static void run_task(void* data) {
    auto* task = static_cast<HostFuncTask*>(data);
    HostFuncShared& sh = *task->shared;
    if (task->captured) {
      if (!sh.closed_flag_.load(std::memory_order_acquire)) {
        task->cb->run(false);
        sh.c.completed.fetch_add(1, std::memory_order_relaxed);
      } else {
        sh.c.discarded.fetch_add(1, std::memory_order_relaxed);
      }
      if (!decrement_if_positive(sh.c.outstanding_graph)) sh.c.unannounced.fetch_add(1);
      return;
    }
    bool run = false;
    {
      std::lock_guard<std::mutex> lock(sh.mu_);
      run = !sh.closed_;
      sh.pending_.erase(task->seq);
    }
    if (run) {
      task->cb->run(true);
      sh.c.completed.fetch_add(1, std::memory_order_relaxed);
    } else {
      sh.c.discarded.fetch_add(1, std::memory_order_relaxed);
    }
    sh.c.outstanding_eager.fetch_sub(1, std::memory_order_acq_rel);
    delete task;
  }

  Status add_pending(HostFuncTask* task) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return Status::failure("host dispatch is shut down");
    task->seq = next_seq_++;
    pending_.emplace(task->seq, task);
    c.outstanding_eager.fetch_add(1, std::memory_order_acq_rel);
    c.launched.fetch_add(1, std::memory_order_relaxed);
    return Status::success();
  }

  // Only for a launch the driver refused: that task will never run.
  void drop_pending(HostFuncTask* task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.erase(task->seq);
    }
    c.outstanding_eager.fetch_sub(1, std::memory_order_acq_rel);
    c.launched.fetch_sub(1, std::memory_order_relaxed);
    delete task;
  }

  ShutdownOutcome close(std::chrono::nanoseconds bound) {
    const std::int64_t start = now_ns();
    const std::int64_t deadline = start + bound.count();
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (closed_ || (pending_.empty() && c.outstanding_graph.load() == 0)) break;
      }
      if (now_ns() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    ShutdownOutcome out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      closed_flag_.store(true, std::memory_order_release);
      for (const auto& [seq, t] : pending_) out.not_run.push_back(t->cb);
    }
    out.graph_callbacks_not_run = c.outstanding_graph.exchange(0);
    out.graph_callbacks_alive = graph_tasks_alive.load();
    out.drained = out.not_run.empty() && out.graph_callbacks_not_run == 0;
    out.waited_s = static_cast<double>(now_ns() - start) * 1e-9;
    return out;
  }

  void stop_at_exit(std::chrono::nanoseconds bound) override { close(bound); }

  std::atomic<std::int64_t> graph_tasks_alive{0};

 private:
  std::mutex mu_;
  std::map<std::uint64_t, HostFuncTask*> pending_;  // eager tasks enqueued, not yet run, in launch order
  std::uint64_t next_seq_ = 0;
  bool closed_ = false;
  std::atomic<bool> closed_flag_{false};
};

// A captured task lives as long as the graph that calls it.
class HostFuncGraphTask final : public GraphOwned {
 public:
  HostFuncGraphTask(std::shared_ptr<HostFuncShared> shared, CallbackPtr cb) {
    task_.shared = std::move(shared);
    task_.cb = std::move(cb);
    task_.captured = true;
    task_.shared->graph_tasks_alive.fetch_add(1);
  }
  ~HostFuncGraphTask() override { task_.shared->graph_tasks_alive.fetch_sub(1); }
  HostFuncTask* task() { return &task_; }

 private:
  HostFuncTask task_;
};

class HostFuncBackend final : public BackendImpl {
 public:
  HostFuncBackend(std::shared_ptr<Device> device, bool spin_wait)
      : device_(std::move(device)), spin_wait_(spin_wait), shared_(std::make_shared<HostFuncShared>()) {
    ExitRegistry::instance().add(shared_);
  }

  Backend kind() const override { return spin_wait_ ? Backend::HostfuncV2 : Backend::Blocking; }

  Status launch(StreamHandle stream, CallbackPtr cb) override {
    auto* task = new HostFuncTask{shared_, std::move(cb), false};
    Status st = shared_->add_pending(task);
    if (!st.ok()) {
      delete task;
      return st;
    }
    st = device_->launch_host_func(stream, &HostFuncShared::run_task, task, spin_wait_);
    if (!st.ok()) shared_->drop_pending(task);  // after success the task may already be gone
    return st;
  }

  Status launch_captured(StreamHandle stream, CallbackPtr cb) override {
    auto owned = std::make_unique<HostFuncGraphTask>(shared_, std::move(cb));
    HostFuncTask* task = owned->task();
    Status st = device_->retain_in_capture(stream, std::move(owned));
    if (!st.ok()) return st;
    st = device_->launch_host_func(stream, &HostFuncShared::run_task, task, spin_wait_);
    if (st.ok()) shared_->c.launched.fetch_add(1, std::memory_order_relaxed);
    return st;
  }

  void announce(std::int64_t callbacks) override { add_clamped(shared_->c.outstanding_graph, callbacks); }

  ShutdownOutcome shutdown(std::chrono::nanoseconds bound) override { return shared_->close(bound); }

  void detach() override {}

  BackendStats stats() const override {
    const Counters& c = shared_->c;
    BackendStats s;
    s.launched = c.launched.load();
    s.completed = c.completed.load();
    s.discarded = c.discarded.load();
    s.unannounced = c.unannounced.load();
    s.outstanding_eager = c.outstanding_eager.load();
    s.outstanding_graph = c.outstanding_graph.load();
    s.graph_callbacks_alive = shared_->graph_tasks_alive.load();
    return s;
  }

 private:
  std::shared_ptr<Device> device_;
  bool spin_wait_;
  std::shared_ptr<HostFuncShared> shared_;
};

}  // namespace fastpath::hostdispatch
