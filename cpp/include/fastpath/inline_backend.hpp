// inline: the callback runs on the launching thread at launch. With a device, the stream is
// synchronized first, so the callback still sees everything enqueued before it.
#pragma once

#include <chrono>
#include <memory>
#include <thread>
#include <utility>

#include "fastpath/backend.hpp"

namespace fastpath::hostdispatch {

class InlineBackend final : public BackendImpl {
 public:
  explicit InlineBackend(std::shared_ptr<Device> device) : device_(std::move(device)) {}

  Backend kind() const override { return Backend::Inline; }

  Status launch(StreamHandle stream, CallbackPtr cb) override {
    if (closed_.load(std::memory_order_acquire)) return Status::failure("host dispatch is shut down");
    if (device_) {
      Status st = device_->synchronize(stream);
      if (!st.ok()) return st;
    }
    c_.launched.fetch_add(1, std::memory_order_relaxed);
    cb->run(true);
    c_.completed.fetch_add(1, std::memory_order_relaxed);
    return Status::success();
  }

  Status launch_captured(StreamHandle, CallbackPtr) override {
    return Status::failure(
        "inline host dispatch cannot be captured into a CUDA graph; use mode 'blocking', 'spin' or 'auto'");
  }

  void announce(std::int64_t) override {}

  // A callback runs on its launching thread, so shutdown can only wait for one still running there.
  ShutdownOutcome shutdown(std::chrono::nanoseconds bound) override {
    closed_.store(true, std::memory_order_release);
    const auto start = std::chrono::steady_clock::now();
    auto running = [&] { return c_.launched.load() - c_.completed.load(); };
    while (running() > 0 && std::chrono::steady_clock::now() - start < bound) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    ShutdownOutcome out;
    out.still_running = running();
    out.drained = out.still_running == 0;
    out.waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return out;
  }

  void detach() override {}

  BackendStats stats() const override {
    BackendStats s;
    s.launched = c_.launched.load();
    s.completed = c_.completed.load();
    return s;
  }

 private:
  std::shared_ptr<Device> device_;
  Counters c_;
  std::atomic<bool> closed_{false};
};

}  // namespace fastpath::hostdispatch
