// doorbell: stream memory operations on flags in mapped pinned memory, served by a host worker.
// The backend owns the worker thread; the thread itself holds only the shared state, so it can
// outlive the backend while live graphs still hold flags.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>
#include <utility>

#include "fastpath/backend.hpp"
#include "fastpath/doorbell_state.hpp"

namespace fastpath::hostdispatch {

class DoorbellBackend final : public BackendImpl {
 public:
  // Allocates the flags up front: a first launch may come during graph capture, where
  // allocating pinned memory is not allowed.
  static std::unique_ptr<DoorbellBackend> create(std::shared_ptr<Device> device, DoorbellOptions opts,
                                                 Status* status) {
    auto state = std::make_shared<DoorbellState>(std::move(device), opts);
    *status = state->init();
    if (!status->ok()) return nullptr;
    ExitRegistry::instance().add(state);
    return std::unique_ptr<DoorbellBackend>(new DoorbellBackend(std::move(state)));
  }

  ~DoorbellBackend() override { detach(); }

  Backend kind() const override { return Backend::Doorbell; }

  Status launch(StreamHandle stream, CallbackPtr cb) override { return state_->launch_eager(stream, std::move(cb)); }

  Status launch_captured(StreamHandle stream, CallbackPtr cb) override {
    return state_->launch_captured(stream, std::move(cb));
  }

  void announce(std::int64_t callbacks) override { state_->announce(callbacks); }

  ShutdownOutcome shutdown(std::chrono::nanoseconds bound) override {
    const std::int64_t deadline = now_ns() + bound.count();
    ShutdownOutcome out = state_->shutdown(bound);
    if (!worker_.joinable()) return out;
    // With nothing left the worker exits within one poll; a little grace past the bound lets it.
    const bool will_exit = out.graph_callbacks_alive == 0 && out.not_run.empty();
    if (will_exit && state_->wait_worker_exit(std::max(deadline, now_ns() + 50'000'000))) {
      worker_.join();
    } else {
      worker_.detach();  // it keeps answering live graphs' flags without running callbacks
    }
    return out;
  }

  void detach() override {
    state_->detach();
    if (worker_.joinable()) worker_.detach();
  }

  BackendStats stats() const override { return state_->stats(); }

  void wait_posted() override { state_->wait_posted(); }

 private:
  explicit DoorbellBackend(std::shared_ptr<DoorbellState> state)
      : state_(std::move(state)), worker_(&DoorbellState::worker_main, state_) {}

  std::shared_ptr<DoorbellState> state_;
  std::thread worker_;
};

}  // namespace fastpath::hostdispatch
