// Guided decoding's per-step host work as a C++ callback: take the step's fed tokens into each
// guided row's xgrammar matcher, then fill the rows' token bitmask. It calls xgrammar through
// tvm-ffi's C ABI and never takes the GIL, so the engine's Python thread and the fill run at the
// same time; a Python callback had to win the GIL from that thread first.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
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
  // `gate` >= 0: a reasoning model's end-of-thinking token; the grammar holds the row only from the
  // token after it (the row is free until the model writes it), as vLLM applies structured outputs
  // after the reasoning.
  GuidedRow(std::shared_ptr<const MatcherApi> api, std::uintptr_t matcher, std::int64_t gate = -1)
      : api_(std::move(api)), matcher_(reinterpret_cast<void*>(matcher)), gate_(gate), open_(gate < 0) {
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
    if (!open_.load()) {  // still thinking: the gate token opens the grammar and is not its input
      if (token == gate_) open_.store(true);
      return;
    }
    if (!live()) return;
    tvm_ffi_abi::Any args[] = {tvm_ffi_abi::object_arg(matcher_), tvm_ffi_abi::int_arg(token),
                               tvm_ffi_abi::bool_arg(false)};
    bool ok = false;
    std::string error;
    if (!api_->call_bool(api_->accept_token, args, 3, &ok, &error)) return fail(error, true);
    if (!ok) return fail("token " + std::to_string(token) + " was sampled outside the grammar", false);
    tvm_ffi_abi::Any self[] = {tvm_ffi_abi::object_arg(matcher_)};
    bool done = false;
    if (!api_->call_bool(api_->is_terminated, self, 1, &done, &error)) return fail(error, true);
    terminated_.store(done);
  }

  // Fills bitmask row `row`; false (and the row failed) when xgrammar refused.
  bool fill(tvm_ffi_abi::DLTensor* bitmask, std::int64_t row) {
    tvm_ffi_abi::Any args[] = {tvm_ffi_abi::object_arg(matcher_), tvm_ffi_abi::tensor_arg(bitmask),
                               tvm_ffi_abi::int_arg(row), tvm_ffi_abi::bool_arg(false)};
    bool constrained = false;
    std::string error;
    const std::int64_t start = now_ns();
    const bool ok = api_->call_bool(api_->fill_next_token_bitmask, args, 4, &constrained, &error);
    last_fill_ns_.store(now_ns() - start);
    if (ok) return true;
    fail(error, true);
    return false;
  }

  // How long the last fill took. A matcher's cost is its grammar state's, and a state (inside a
  // bounded repetition, say) lasts several tokens: the next fill likely costs about the same.
  std::int64_t last_fill_ns() const { return last_fill_ns_.load(); }

  bool live() const { return !failed_.load() && !terminated_.load(); }
  // Whether the grammar holds the row yet (always, without a gate).
  bool open() const { return open_.load(); }
  bool terminated() const { return terminated_.load(); }
  std::int64_t accepted() const { return accepted_.load(); }
  std::string error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }
  // An xgrammar call that failed (not a refused token), once: the fill reports it to Python.
  bool take_internal_error(std::string* why) {
    if (!internal_.exchange(false)) return false;
    *why = error();
    return true;
  }

 private:
  void fail(const std::string& why, bool internal) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_.empty()) return;
      error_ = why;
    }
    if (internal) internal_.store(true);
    failed_.store(true);
  }

  std::shared_ptr<const MatcherApi> api_;
  void* matcher_;
  const std::int64_t gate_;
  std::atomic<bool> open_;
  std::atomic<std::int64_t> accepted_{0};
  std::atomic<std::int64_t> last_fill_ns_{0};
  std::atomic<bool> terminated_{false};
  std::atomic<bool> failed_{false};
  std::atomic<bool> internal_{false};
  mutable std::mutex mu_;
  std::string error_;
};

using RowPlan = std::vector<std::shared_ptr<GuidedRow>>;  // null: a free row

// Worker threads that share one step's rows with the calling thread. The caller never waits for a
// worker to wake: it takes rows itself, and waits only for rows a worker has already taken, so a
// pool whose threads are slow to wake (or gone, after a fork) costs what one thread does.
// A futex wake-up takes tens of microseconds: a worker spins for kWorkerSpinNs after a job before it
// sleeps (a prefill's fill and the next decode step's come that close), and the caller spins on a
// row still running, which is on the step's path, for up to kCallerSpinNs before it sleeps.
class RowPool {
 public:
  explicit RowPool(int workers) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~RowPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_.store(true);
    }
    wake_.notify_all();
    for (auto& t : threads_) {
      if (process_exiting().load()) t.detach();  // at exit, a join can wait on a thread already gone
      else t.join();
    }
  }
  RowPool(const RowPool&) = delete;
  RowPool& operator=(const RowPool&) = delete;

  static constexpr std::int64_t kWorkerSpinNs = 200'000;
  static constexpr std::int64_t kCallerSpinNs = 2'000'000;  // longer than one expensive row

  std::size_t workers() const { return threads_.size(); }

  // job(i) for every i in [0, n), each exactly once; returns when all have run.
  void run(std::size_t n, const std::function<void(std::size_t)>& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      n_ = n;
      next_.store(0);
      done_.store(0);
      epoch_.fetch_add(1);
    }
    wake_.notify_all();
    work(job, n);
    const auto finished = [&] { return done_.load() == n && active_.load() == 0; };
    for (const std::int64_t until = now_ns() + kCallerSpinNs; !finished() && now_ns() < until;) cpu_relax();
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, finished);
    job_ = nullptr;  // a worker that wakes now finds nothing to do
  }

 private:
  void work(const std::function<void(std::size_t)>& job, std::size_t n) {
    for (std::size_t i = next_.fetch_add(1); i < n; i = next_.fetch_add(1)) {
      job(i);
      done_.fetch_add(1);
    }
  }

  void loop() {
    std::uint64_t seen = 0;
    while (true) {
      for (const std::int64_t until = now_ns() + kWorkerSpinNs;
           epoch_.load() == seen && !stop_.load() && now_ns() < until;) {
        cpu_relax();
      }
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_.load() || epoch_.load() != seen; });
      if (stop_.load()) return;
      seen = epoch_.load();
      if (job_ == nullptr) continue;
      const auto* job = job_;
      const std::size_t n = n_;
      active_.fetch_add(1);
      lock.unlock();
      work(*job, n);
      lock.lock();
      active_.fetch_sub(1);
      idle_.notify_all();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  const std::function<void(std::size_t)>* job_ = nullptr;  // under mu_
  std::size_t n_ = 0;                                       // under mu_
  std::atomic<std::uint64_t> epoch_{0};  // written under mu_, so a sleeper's wait cannot miss it
  // Workers inside work(): run() may not return (and end job) while any is. Written under mu_.
  std::atomic<int> active_{0};
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> next_{0};
  std::atomic<std::size_t> done_{0};
};

// The shared state a captured fill callback reads: pinned buffers and a queue of row plans, one
// per launched step, in launch order (a graph replay takes no per-step arguments). Plans hold at
// most max_rows rows; rows past a plan's end keep their flags (callers pad plans to the step).
class GuidedFill {
 public:
  // `owner` keeps the buffers alive for as long as any callback can still touch them.
  // `threads` > 1: a step's rows are spread over that many threads (the callback's own and a pool).
  GuidedFill(std::uintptr_t tokens, std::uintptr_t mask, std::uintptr_t flags, std::int64_t max_rows,
             std::int64_t words, std::shared_ptr<void> owner, int threads = 1)
      : owner_(std::move(owner)),
        tokens_(reinterpret_cast<const std::int64_t*>(tokens)),
        flags_(reinterpret_cast<std::int32_t*>(flags)),
        max_rows_(max_rows),
        shape_{max_rows, words} {
    tensor_ = {reinterpret_cast<void*>(mask), 1, 0, 2, 0, 32, 1, shape_, nullptr, 0};
    if (threads > 1) pool_ = std::make_unique<RowPool>(threads - 1);
    threads_.store(threads > 1 ? threads : 1);
  }

  std::int64_t max_rows() const { return max_rows_; }
  int threads() const { return threads_.load(); }  // no lock: a fill holds pool_mu_ for milliseconds

  // Spreads later fills over `threads` threads; waits for a fill in progress.
  void set_threads(int threads) {
    std::unique_ptr<RowPool> pool = threads > 1 ? std::make_unique<RowPool>(threads - 1) : nullptr;
    std::lock_guard<std::mutex> lock(pool_mu_);
    pool_.swap(pool);
    threads_.store(threads > 1 ? threads : 1);
  }

  // The caller's thread (Python's): plans the callback is done with are dropped here, so the last
  // reference to a matcher is never let go on a callback thread.
  void enqueue(RowPlan plan) {
    std::deque<RowPlan> spent;
    {
      std::lock_guard<std::mutex> lock(mu_);
      plans_.push_back(std::move(plan));
      spent.swap(spent_);
    }
  }

  // Failures since the last call: a step with no plan, or an xgrammar call that failed.
  std::vector<std::string> take_errors() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    out.swap(errors_);
    return out;
  }

  // The callback: the step's fed tokens into its guided rows, then their bitmask rows.
  void run_step() {
    const std::int64_t start = now_ns();
    RowPlan plan;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (plans_.empty()) {
        ++missing_plans_;
        errors_.push_back("a guided fill ran with no row plan queued: this step's rows run unconstrained");
      } else {
        plan = std::move(plans_.front());
        plans_.pop_front();
      }
    }
    if (plan.empty()) {
      for (std::int64_t r = 0; r < max_rows_; ++r) flags_[r] = 0;
      return;
    }
    fill(plan, /*accept_first=*/true);
    const std::int64_t took = now_ns() - start;
    busy_ns_.fetch_add(took);
    std::lock_guard<std::mutex> lock(mu_);
    spent_.push_back(std::move(plan));
    durations_[steps_++ % kDurations] = took;
  }

  // Row r constrained <=> flags[r] == 1; a free row's mask words are stale and ignored. With
  // `accept_first`, each row first takes the step's fed token. Rows are independent (a matcher and a
  // mask row each), so they may run on any thread.
  void fill(const RowPlan& plan, bool accept_first = false) {
    const std::size_t n = std::min<std::size_t>(plan.size(), static_cast<std::size_t>(max_rows_));
    std::vector<std::string> failed;
    std::mutex failed_mu;
    const std::function<void(std::size_t)> row = [&](std::size_t r) {
      const auto& g = plan[r];
      if (g && accept_first && g->live()) g->accept(tokens_[r]);
      const bool constrained = g && g->live() && g->open() && g->fill(&tensor_, static_cast<std::int64_t>(r));
      flags_[r] = constrained ? 1 : 0;
      std::string why;
      if (g && g->take_internal_error(&why)) {
        std::lock_guard<std::mutex> lock(failed_mu);
        failed.push_back("row " + std::to_string(r) + ": " + why);
      }
    };
    std::lock_guard<std::mutex> pool_lock(pool_mu_);
    if (pool_ && n > 1) {
      // Longest first: one row's fill can cost 200x another's (3 us against 650 in the bench's
      // grammar), and an expensive row taken last would set the step's time alone.
      std::vector<std::size_t> order(n);
      std::vector<std::int64_t> cost(n, 0);
      for (std::size_t r = 0; r < n; ++r) {
        order[r] = r;
        if (plan[r]) cost[r] = plan[r]->last_fill_ns();
      }
      std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return cost[a] > cost[b]; });
      pool_->run(n, [&](std::size_t i) { row(order[i]); });
      std::sort(failed.begin(), failed.end());  // the order rows finished in is not the rows' order
    } else {
      for (std::size_t r = 0; r < n; ++r) row(r);
    }
    fills_.fetch_add(1);
    if (!failed.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      errors_.insert(errors_.end(), failed.begin(), failed.end());
    }
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
  // How long each of the last (up to kDurations) decode steps' fills took, oldest first.
  std::vector<double> step_durations_us() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<double> out;
    const std::int64_t kept = std::min<std::int64_t>(steps_, kDurations);
    for (std::int64_t i = steps_ - kept; i < steps_; ++i) out.push_back(durations_[i % kDurations] * 1e-3);
    return out;
  }

  std::int64_t steps() const {  // decode steps filled: run_step calls that found a plan
    std::lock_guard<std::mutex> lock(mu_);
    return steps_;
  }

  static constexpr std::int64_t kDurations = 4096;

 private:
  std::shared_ptr<void> owner_;
  const std::int64_t* tokens_;
  std::int32_t* flags_;
  std::int64_t max_rows_;
  std::int64_t shape_[2];
  tvm_ffi_abi::DLTensor tensor_{};
  mutable std::mutex mu_;
  std::deque<RowPlan> plans_;
  std::deque<RowPlan> spent_;
  std::vector<std::string> errors_;
  std::int64_t missing_plans_ = 0;
  std::int64_t steps_ = 0;                           // decode steps filled, under mu_
  std::vector<std::int64_t> durations_ = std::vector<std::int64_t>(kDurations);  // ns, a ring
  std::atomic<std::int64_t> fills_{0};
  std::atomic<std::int64_t> busy_ns_{0};
  // Held by a fill for as long as it uses the pool. RowPool::run is not re-entrant, and a prefill's
  // fill on the engine's thread can overlap a decode step's in its callback; set_threads never frees
  // a pool in use either.
  mutable std::mutex pool_mu_;
  std::atomic<int> threads_{1};
  std::unique_ptr<RowPool> pool_;  // last: its threads stop before the buffers they write go
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
