// A CPU stand-in for a CUDA device, so every backend's protocol runs in tests without a GPU.
// A SimStream is a thread that executes enqueued operations in order: flag writes and waits,
// host functions, and "kernels" that only take time. It captures operations into SimGraphs and
// replays them. Its queue is bounded, so a launch blocks when it is full, as a CUDA launch does
// when the driver's push buffer is.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fastpath/device.hpp"
#include "fastpath/spin_util.hpp"

namespace fastpath::hostdispatch {

struct SimOp {
  enum class Kind { Write, Wait, HostFunc, Busy, Queue };
  Kind kind = Kind::Busy;
  std::uint64_t addr = 0;  // Queue: the flag
  std::uint32_t value = 0;  // Queue: the slot word
  QueueMemory queue;
  HostFn fn = nullptr;
  void* data = nullptr;
  std::int64_t busy_ns = 0;
  std::shared_ptr<void> keepalive;  // a replayed graph's body outlives its queued operations
};

// What a captured graph holds: its operations, and what it owns (destroyed with the last of it).
struct SimGraphBody {
  std::vector<SimOp> ops;
  std::vector<std::unique_ptr<GraphOwned>> owned;
};

class SimStream {
 public:
  explicit SimStream(std::size_t capacity) : capacity_(capacity < 1 ? 1 : capacity), thread_([this] { run(); }) {}

  // Pending waits and busy operations end at once; host functions still run, so their tasks are freed.
  ~SimStream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_.store(true);
    }
    not_empty_.notify_all();
    not_full_.notify_all();
    thread_.join();
  }
  SimStream(const SimStream&) = delete;
  SimStream& operator=(const SimStream&) = delete;

  StreamHandle handle() const { return reinterpret_cast<StreamHandle>(this); }

  Status push(SimOp op) {
    std::unique_lock<std::mutex> lock(mu_);
    if (capture_) {
      capture_->ops.push_back(std::move(op));
      return Status::success();
    }
    not_full_.wait(lock, [&] { return q_.size() < capacity_ || stop_.load(); });
    if (stop_.load()) return Status::failure("the simulated stream is closed");
    q_.push_back(std::move(op));
    lock.unlock();
    not_empty_.notify_one();
    return Status::success();
  }

  Status busy(double seconds) {
    SimOp op;
    op.kind = SimOp::Kind::Busy;
    op.busy_ns = static_cast<std::int64_t>(seconds * 1e9);
    return push(std::move(op));
  }

  std::uint64_t begin_capture() {
    static std::atomic<std::uint64_t> next_id{1};
    std::lock_guard<std::mutex> lock(mu_);
    if (capture_) throw std::runtime_error("the simulated stream is already capturing");
    capture_ = std::make_shared<SimGraphBody>();
    capture_id_ = next_id.fetch_add(1);
    return capture_id_;
  }

  std::shared_ptr<SimGraphBody> end_capture() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!capture_) throw std::runtime_error("the simulated stream is not capturing");
    capture_id_ = 0;
    return std::move(capture_);
  }

  CaptureState capture_state() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {static_cast<bool>(capture_), capture_id_};
  }

  Status retain(std::unique_ptr<GraphOwned> owned) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!capture_) return Status::failure("no capture on this simulated stream");
    capture_->owned.push_back(std::move(owned));
    return Status::success();
  }

  Status replay(const std::shared_ptr<SimGraphBody>& body) {
    for (const SimOp& captured : body->ops) {
      SimOp op = captured;
      op.keepalive = body;
      Status st = push(std::move(op));
      if (!st.ok()) return st;
    }
    return Status::success();
  }

  // True once everything enqueued has run; false when timeout_s (negative: no limit) passed.
  bool synchronize(double timeout_s) {
    std::unique_lock<std::mutex> lock(mu_);
    auto done = [&] { return q_.empty() && !executing_; };
    if (timeout_s < 0) {
      idle_.wait(lock, done);
      return true;
    }
    return idle_.wait_for(lock, std::chrono::duration<double>(timeout_s), done);
  }

  std::int64_t executed() const { return executed_.load(); }

  // A kernel preempted between its claim and its store: the queue has a gap meanwhile.
  void delay_queue_stores(double seconds) { queue_store_delay_ns_.store(static_cast<std::int64_t>(seconds * 1e9)); }

 private:
  void run() {
    for (;;) {
      SimOp op;
      {
        std::unique_lock<std::mutex> lock(mu_);
        not_empty_.wait(lock, [&] { return !q_.empty() || stop_.load(); });
        if (q_.empty()) return;  // stopped and drained
        op = std::move(q_.front());
        q_.pop_front();
        executing_ = true;
      }
      not_full_.notify_one();
      execute(op);
      op = SimOp();  // drop the graph body outside the lock: it may destroy what the graph owned
      {
        std::lock_guard<std::mutex> lock(mu_);
        executing_ = false;
      }
      executed_.fetch_add(1);
      idle_.notify_all();
    }
  }

  void execute(const SimOp& op) {
    auto* word = reinterpret_cast<std::atomic<std::uint32_t>*>(static_cast<std::uintptr_t>(op.addr));
    switch (op.kind) {
      case SimOp::Kind::Write:
        word->store(op.value, std::memory_order_release);
        break;
      case SimOp::Kind::Wait:
        wait_for(op.addr, op.value);
        break;
      case SimOp::Kind::HostFunc:
        op.fn(op.data);
        break;
      case SimOp::Kind::Queue:
        ring_queue(op);
        break;
      case SimOp::Kind::Busy: {
        const std::int64_t until = now_ns() + op.busy_ns;
        while (now_ns() < until && !stop_.load(std::memory_order_relaxed)) {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        break;
      }
    }
  }

  // What the queue kernel does (cuda_queue.hpp), on host atomics.
  void ring_queue(const SimOp& op) {
    const QueueMemory& q = op.queue;
    auto* words = reinterpret_cast<std::atomic<std::uint32_t>*>(static_cast<std::uintptr_t>(q.device_words));
    auto* consumed = static_cast<std::atomic<std::uint32_t>*>(q.consumed_host());
    auto* entries = static_cast<std::atomic<std::uint64_t>*>(q.host.host);
    std::uint32_t limit = words[1].load(std::memory_order_relaxed);
    const std::uint32_t s = words[0].fetch_add(1);
    if (static_cast<std::int32_t>(s - limit) >= 0) {
      while (static_cast<std::int32_t>(s - (limit = consumed->load(std::memory_order_acquire) + q.entries)) >= 0) {
        if (stop_.load(std::memory_order_relaxed)) return;
        std::this_thread::yield();
      }
      words[1].store(limit, std::memory_order_release);
    }
    if (const std::int64_t delay = queue_store_delay_ns_.load(); delay > 0) {
      std::this_thread::sleep_for(std::chrono::nanoseconds(delay));
    }
    entries[s & (q.entries - 1)].store(static_cast<std::uint64_t>(op.value) << 32 | (s + 1), std::memory_order_release);
    if ((op.value & kQueueWaits) != 0) wait_for(op.addr, s + 1);
  }

  void wait_for(std::uint64_t addr, std::uint32_t value) {
    auto* word = reinterpret_cast<std::atomic<std::uint32_t>*>(static_cast<std::uintptr_t>(addr));
    std::uint32_t polls = 0;
    while (word->load(std::memory_order_acquire) != value && !stop_.load(std::memory_order_relaxed)) {
      if (++polls < 1000) {
        cpu_relax();
      } else {
        std::this_thread::yield();  // a CI machine may have fewer cores than spinning threads
      }
    }
  }

  const std::size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable not_full_, not_empty_, idle_;
  std::deque<SimOp> q_;
  bool executing_ = false;
  std::atomic<bool> stop_{false};
  std::shared_ptr<SimGraphBody> capture_;
  std::uint64_t capture_id_ = 0;
  std::atomic<std::int64_t> executed_{0};
  std::atomic<std::int64_t> queue_store_delay_ns_{0};
  std::thread thread_;  // last: starts after every member above exists
};

struct SimDeviceConfig {
  bool hostfunc_v2 = true;
  bool memops = true;
  int runtime_version = 13020;
  int driver_version = 13020;
  bool queue = true;  // the queue ring; without it the doorbell rings with two memory operations
};

class SimDevice final : public Device {
 public:
  explicit SimDevice(SimDeviceConfig config) : config_(config) {}

  std::string name() const override { return "sim"; }

  Capabilities probe() override {
    Capabilities caps;
    caps.runtime_version = config_.runtime_version;
    caps.driver_version = config_.driver_version;
    caps.cuda = {true, "simulated device"};
    caps.hostfunc_v2 = {config_.hostfunc_v2, config_.hostfunc_v2 ? "simulated" : "absent on the simulated device"};
    caps.memops = {config_.memops, config_.memops ? "simulated" : "absent on the simulated device"};
    return caps;
  }

  Status alloc_flags(std::size_t bytes, FlagMemory* out) override {
    const std::size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) return Status::failure("out of memory for simulated flags");
    std::memset(p, 0, rounded);
    *out = {p, static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)), rounded};
    return Status::success();
  }

  void free_flags(const FlagMemory& mem) override { std::free(mem.host); }

  RingChoice choose_ring(Ring wanted) override {
    if (config_.queue && (wanted == Ring::Auto || wanted == Ring::Queue)) return {Ring::Queue, "queue ring (simulated)"};
    return Device::choose_ring(wanted);
  }

  Status alloc_queue(std::uint32_t entries, QueueMemory* out) override {
    Status st = check_queue_entries(entries);
    if (!st.ok()) return st;
    QueueMemory q;
    q.entries = entries;
    st = alloc_flags(QueueMemory::host_bytes(entries), &q.host);
    if (!st.ok()) return st;
    auto* words = static_cast<std::uint32_t*>(std::aligned_alloc(64, 64));
    if (words == nullptr) {
      free_flags(q.host);
      return Status::failure("out of memory for the simulated queue");
    }
    words[0] = 0;
    words[1] = entries;
    q.device_words = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(words));
    *out = q;
    return Status::success();
  }

  void free_queue(const QueueMemory& q) override {
    std::free(reinterpret_cast<void*>(static_cast<std::uintptr_t>(q.device_words)));
    free_flags(q.host);
  }

  Status ring_queue(StreamHandle stream, const QueueMemory& q, std::uint32_t slot, bool waits,
                    std::uint64_t flag, bool) override {
    SimOp op;
    op.kind = SimOp::Kind::Queue;
    op.addr = flag;
    op.value = waits ? slot | kQueueWaits : slot;
    op.queue = q;
    return push(stream, std::move(op));
  }

  Status write_flag(StreamHandle stream, std::uint64_t addr, std::uint32_t value) override {
    SimOp op;
    op.kind = SimOp::Kind::Write;
    op.addr = addr;
    op.value = value;
    return push(stream, std::move(op));
  }

  Status wait_flag(StreamHandle stream, std::uint64_t addr, std::uint32_t value) override {
    SimOp op;
    op.kind = SimOp::Kind::Wait;
    op.addr = addr;
    op.value = value;
    return push(stream, std::move(op));
  }

  Status launch_host_func(StreamHandle stream, HostFn fn, void* data, bool) override {
    SimOp op;
    op.kind = SimOp::Kind::HostFunc;
    op.fn = fn;
    op.data = data;
    return push(stream, std::move(op));
  }

  Status capture_state(StreamHandle stream, CaptureState* out) override {
    SimStream* s = as_stream(stream);
    if (s == nullptr) return no_stream();
    *out = s->capture_state();
    return Status::success();
  }

  Status retain_in_capture(StreamHandle stream, std::unique_ptr<GraphOwned> owned) override {
    SimStream* s = as_stream(stream);
    if (s == nullptr) return no_stream();
    return s->retain(std::move(owned));
  }

  Status synchronize(StreamHandle stream) override {
    SimStream* s = as_stream(stream);
    if (s == nullptr) return no_stream();
    s->synchronize(-1);
    return Status::success();
  }

 private:
  static SimStream* as_stream(StreamHandle h) { return reinterpret_cast<SimStream*>(h); }
  static Status no_stream() { return Status::failure("the simulated device needs a SimStream's handle, not 0"); }
  static Status push(StreamHandle stream, SimOp op) {
    SimStream* s = as_stream(stream);
    return s == nullptr ? no_stream() : s->push(std::move(op));
  }

  SimDeviceConfig config_;
};

}  // namespace fastpath::hostdispatch
