// What a host callback is to the backends: a task that runs on a dispatch thread and never throws.
// Python callables implement it in py_callback.hpp; the C++ tasks below need no Python at all.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace fastpath::hostdispatch {

class Callback {
 public:
  Callback() { live_count().fetch_add(1, std::memory_order_relaxed); }
  virtual ~Callback() { live_count().fetch_sub(1, std::memory_order_relaxed); }
  Callback(const Callback&) = delete;
  Callback& operator=(const Callback&) = delete;

  // last_use: nothing runs this callback again, so it may let go of what it holds right away.
  virtual void run(bool last_use) noexcept = 0;
  // For reports. A Python callable needs the GIL for this; only Python-facing code calls it.
  virtual std::string describe() const = 0;

  // Posted: the stream goes on without waiting for it (where the backend can; others wait).
  bool posted() const { return posted_; }
  void set_posted(bool posted) { posted_ = posted; }

  // Callbacks alive in this extension: a leak shows up here.
  static std::atomic<std::int64_t>& live_count() {
    static std::atomic<std::int64_t> count{0};
    return count;
  }

 private:
  bool posted_ = false;
};

using CallbackPtr = std::shared_ptr<Callback>;

// Calls a plain C function with its argument.
class FunctionCallback final : public Callback {
 public:
  FunctionCallback(void (*fn)(void*), void* data, std::string name)
      : fn_(fn), data_(data), name_(std::move(name)) {}
  void run(bool) noexcept override { fn_(data_); }
  std::string describe() const override { return name_; }

 private:
  void (*fn_)(void*);
  void* data_;
  std::string name_;
};

// Appends tags in the order callbacks ran: the C++ side of order and count checks.
class CallLog {
 public:
  void append(std::int64_t tag) {
    std::lock_guard<std::mutex> lock(mu_);
    tags_.push_back(tag);
  }
  std::vector<std::int64_t> tags() const {
    std::lock_guard<std::mutex> lock(mu_);
    return tags_;
  }
  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return tags_.size();
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    tags_.clear();
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::int64_t> tags_;
};

class AppendTag final : public Callback {
 public:
  AppendTag(std::shared_ptr<CallLog> log, std::int64_t tag) : log_(std::move(log)), tag_(tag) {}
  void run(bool) noexcept override {
    try {
      log_->append(tag_);
    } catch (...) {  // only allocation can fail here; a lost tag is what a count check then reports
    }
  }
  std::string describe() const override { return "CallLog.append(" + std::to_string(tag_) + ")"; }

 private:
  std::shared_ptr<CallLog> log_;
  std::int64_t tag_;
};

}  // namespace fastpath::hostdispatch
