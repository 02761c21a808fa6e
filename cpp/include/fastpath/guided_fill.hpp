// Guided decoding's per-step host work as a C++ callback: take the step's fed tokens into each
// guided row's xgrammar matcher, then fill the rows' token bitmask. It calls xgrammar through
// tvm-ffi's C ABI and never takes the GIL, so the engine's Python thread and the fill run at the
// same time; a Python callback had to win the GIL from that thread first.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "fastpath/callback.hpp"
#include "fastpath/device.hpp"
#include "fastpath/spin_util.hpp"
#include "fastpath/tvm_ffi_abi.hpp"

namespace fastpath::hostdispatch {

// tvm-ffi's entry points and xgrammar's GrammarMatcher methods, as addresses found in Python.
struct MatcherApi {
  tvm_ffi_abi::FunctionCall call = nullptr;
  tvm_ffi_abi::ObjectRefFn inc_ref = nullptr;
  tvm_ffi_abi::ObjectRefFn dec_ref = nullptr;
  tvm_ffi_abi::ErrorMoveFromRaised move_error = nullptr;
  void* accept_token = nullptr;             // (self, int token, bool debug) -> bool
  void* is_terminated = nullptr;            // (self) -> bool
  void* fill_next_token_bitmask = nullptr;  // (self, DLTensor* bitmask, int row, bool debug) -> bool

  // f(args...) -> bool, or the error's message.
  bool call_bool(void* f, tvm_ffi_abi::Any* args, std::int32_t n, bool* out, std::string* error) const {
    tvm_ffi_abi::Any result{};
    if (call(f, args, n, &result) != 0) {
      void* err = nullptr;
      move_error(&err);
      *error = "xgrammar call failed";
      if (err != nullptr) {
        const auto* cell = reinterpret_cast<const tvm_ffi_abi::ErrorCell*>(static_cast<char*>(err) +
                                                                           sizeof(tvm_ffi_abi::Object));
        *error = std::string(cell->kind.data, cell->kind.size) + ": " +
                 std::string(cell->message.data, cell->message.size);
        dec_ref(err);
      }
      return false;
    }
    if (result.type_index >= tvm_ffi_abi::kObjectBegin) dec_ref(result.v_ptr);
    *out = result.type_index == tvm_ffi_abi::kBool && result.v_int64 != 0;
    return true;
  }
};

// One guided request: its matcher (a reference held) and what the fills did with it.
class GuidedRow {
 public:
  GuidedRow(std::shared_ptr<const MatcherApi> api, std::uintptr_t matcher)
      : api_(std::move(api)), matcher_(reinterpret_cast<void*>(matcher)) {
    api_->inc_ref(matcher_);
  }
  ~GuidedRow() {
    if (!process_exiting().load()) api_->dec_ref(matcher_);
  }
  GuidedRow(const GuidedRow&) = delete;
  GuidedRow& operator=(const GuidedRow&) = delete;

  // Takes one output token. A token the grammar refuses marks the row failed; it is then free.
  void accept(std::int64_t token) {
    accepted_.fetch_add(1);
    if (!live()) return;
    tvm_ffi_abi::Any args[] = {tvm_ffi_abi::object_arg(matcher_), tvm_ffi_abi::int_arg(token),
                               tvm_ffi_abi::bool_arg(false)};
    bool ok = false;
    std::string error;
    if (!api_->call_bool(api_->accept_token, args, 3, &ok, &error)) return fail(error);
    if (!ok) return fail("token " + std::to_string(token) + " was sampled outside the grammar");
    tvm_ffi_abi::Any self[] = {tvm_ffi_abi::object_arg(matcher_)};
    bool done = false;
    if (!api_->call_bool(api_->is_terminated, self, 1, &done, &error)) return fail(error);
    terminated_.store(done);
  }

  // Fills bitmask row `row`; false (and the row failed) when xgrammar refused.
  bool fill(tvm_ffi_abi::DLTensor* bitmask, std::int64_t row) {
    tvm_ffi_abi::Any args[] = {tvm_ffi_abi::object_arg(matcher_), tvm_ffi_abi::tensor_arg(bitmask),
                               tvm_ffi_abi::int_arg(row), tvm_ffi_abi::bool_arg(false)};
    bool constrained = false;
    std::string error;
    if (api_->call_bool(api_->fill_next_token_bitmask, args, 4, &constrained, &error)) return true;
    fail(error);
    return false;
  }

  bool live() const { return !failed_.load() && !terminated_.load(); }
  bool terminated() const { return terminated_.load(); }
  std::int64_t accepted() const { return accepted_.load(); }
  std::string error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

 private:
  void fail(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (error_.empty()) error_ = why;
    }
    failed_.store(true);
  }

  std::shared_ptr<const MatcherApi> api_;
  void* matcher_;
  std::atomic<std::int64_t> accepted_{0};
  std::atomic<bool> terminated_{false};
  std::atomic<bool> failed_{false};
  mutable std::mutex mu_;
  std::string error_;
};

using RowPlan = std::vector<std::shared_ptr<GuidedRow>>;  // null: a free row

// The shared state a captured fill callback reads: pinned buffers and a queue of row plans, one
// per launched step, in launch order (a graph replay takes no per-step arguments).
class GuidedFill {
 public:
  GuidedFill(std::uintptr_t tokens, std::uintptr_t mask, std::uintptr_t flags, std::int64_t max_rows,
             std::int64_t words)
      : tokens_(reinterpret_cast<const std::int64_t*>(tokens)),
        flags_(reinterpret_cast<std::int32_t*>(flags)),
        max_rows_(max_rows),
        shape_{max_rows, words} {
    tensor_ = {reinterpret_cast<void*>(mask), 1, 0, 2, 0, 32, 1, shape_, nullptr, 0};
  }

  void enqueue(RowPlan plan) {
    std::lock_guard<std::mutex> lock(mu_);
    plans_.push_back(std::move(plan));
  }

  // The callback: the step's fed tokens into its guided rows, then their bitmask rows.
  void run_step() {
    const std::int64_t start = now_ns();
    RowPlan plan;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (plans_.empty()) {
        ++missing_plans_;
        return;
      }
      plan = std::move(plans_.front());
      plans_.pop_front();
    }
    for (std::size_t r = 0; r < plan.size(); ++r) {
      if (plan[r] && plan[r]->live()) plan[r]->accept(tokens_[r]);
    }
    fill(plan);
    busy_ns_.fetch_add(now_ns() - start);
  }

  // Row r constrained <=> flags[r] == 1; a free row's mask words are stale and ignored.
  void fill(const RowPlan& plan) {
    const std::size_t n = std::min<std::size_t>(plan.size(), static_cast<std::size_t>(max_rows_));
    for (std::size_t r = 0; r < n; ++r) {
      const bool constrained = plan[r] && plan[r]->live() && plan[r]->fill(&tensor_, static_cast<std::int64_t>(r));
      flags_[r] = constrained ? 1 : 0;
    }
    fills_.fetch_add(1);
  }

  std::int64_t fills() const { return fills_.load(); }
  double step_seconds() const { return static_cast<double>(busy_ns_.load()) * 1e-9; }  // inside run_step
  std::int64_t missing_plans() const {
    std::lock_guard<std::mutex> lock(mu_);
    return missing_plans_;
  }
  std::size_t queued() const {
    std::lock_guard<std::mutex> lock(mu_);
    return plans_.size();
  }

 private:
  const std::int64_t* tokens_;
  std::int32_t* flags_;
  std::int64_t max_rows_;
  std::int64_t shape_[2];
  tvm_ffi_abi::DLTensor tensor_{};
  mutable std::mutex mu_;
  std::deque<RowPlan> plans_;
  std::int64_t missing_plans_ = 0;
  std::atomic<std::int64_t> fills_{0};
  std::atomic<std::int64_t> busy_ns_{0};
};

class GuidedFillStep final : public Callback {
 public:
  explicit GuidedFillStep(std::shared_ptr<GuidedFill> fill) : fill_(std::move(fill)) {}
  void run(bool) noexcept override { fill_->run_step(); }
  std::string describe() const override { return "GuidedFill.run_step()"; }

 private:
  std::shared_ptr<GuidedFill> fill_;
};

}  // namespace fastpath::hostdispatch
