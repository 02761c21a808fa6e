// Step k's sampled tokens are in pinned memory: the stream says so through a C++ callback (no GIL),
// and a streaming thread waits for step k with the GIL released and a timeout.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "fastpath/callback.hpp"

namespace fastpath::hostdispatch {

class TokenReadyFlag {
 public:
  // Steps are numbered from 0; after advance() is called n times, steps 0..n-1 are ready.
  void advance() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++ready_;
    }
    cv_.notify_all();
  }

  void mark(std::int64_t step) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_ = std::max(ready_, step + 1);
    }
    cv_.notify_all();
  }

  // True once `step` is ready; false when timeout_s (negative: no limit) ran out first.
  bool wait(std::int64_t step, double timeout_s) {
    std::unique_lock<std::mutex> lock(mu_);
    auto ready = [&] { return ready_ > step; };
    if (timeout_s < 0) {
      cv_.wait(lock, ready);
      return true;
    }
    return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), ready);
  }

  std::int64_t ready_steps() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ready_;
  }

  void reset(std::int64_t ready = 0) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_ = ready;
    }
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::int64_t ready_ = 0;
};

// Each run marks the next step: the form a graph replayed once per step uses.
class AdvanceTokenFlag final : public Callback {
 public:
  explicit AdvanceTokenFlag(std::shared_ptr<TokenReadyFlag> flag) : flag_(std::move(flag)) {}
  void run(bool) noexcept override { flag_->advance(); }
  std::string describe() const override { return "TokenReadyFlag.advance()"; }

 private:
  std::shared_ptr<TokenReadyFlag> flag_;
};

class MarkTokenStep final : public Callback {
 public:
  MarkTokenStep(std::shared_ptr<TokenReadyFlag> flag, std::int64_t step) : flag_(std::move(flag)), step_(step) {}
  void run(bool) noexcept override { flag_->mark(step_); }
  std::string describe() const override { return "TokenReadyFlag.mark(" + std::to_string(step_) + ")"; }

 private:
  std::shared_ptr<TokenReadyFlag> flag_;
  std::int64_t step_;
};

}  // namespace fastpath::hostdispatch
