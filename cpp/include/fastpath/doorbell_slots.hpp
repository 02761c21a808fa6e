// The doorbell's flags and who owns them.
//
// Protocol, one 32-bit flag per cache line of mapped pinned memory:
//   stream:  write(flag, kFlagRequested); wait(flag == kFlagServed)
//   worker:  sees kFlagRequested -> runs the callback -> stores kFlagServed (release)
// The stream's own write of kFlagRequested is what resets the flag, so a graph replays with no
// host reset, and the stream writes it again only after its wait saw kFlagServed, so the two
// writers never race: the flag strictly alternates. A flag is never shared by two launch sites
// that could run concurrently: each stream has one (its callbacks queue in order behind it)
// and each captured callback has its own for the life of its graph.
//
// The queue ring (device.hpp) requests through a queue instead, so the worker need not scan the
// flags, and answers with the request's sequence number: a flag only ever moves forward.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fastpath/callback.hpp"
#include "fastpath/device.hpp"

namespace fastpath::hostdispatch {

inline constexpr std::uint32_t kFlagIdle = 0;
inline constexpr std::uint32_t kFlagRequested = 1;
inline constexpr std::uint32_t kFlagServed = 2;
inline constexpr std::size_t kFlagStride = 64;  // one cache line per flag: no false sharing

struct alignas(kFlagStride) FlagLine {
  std::atomic<std::uint32_t> state{kFlagIdle};
};
static_assert(sizeof(FlagLine) == kFlagStride, "one flag per cache line");
static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "the device writes the flag as a plain word");

enum class SlotKind : int { Free = 0, Stream = 1, Graph = 2 };

struct SlotInfo {
  std::atomic<int> kind{static_cast<int>(SlotKind::Free)};  // published after the fields below
  StreamHandle stream = 0;
  std::mutex launch_mu;  // one launcher at a time: queue order must equal stream order
  std::mutex fifo_mu;
  std::deque<CallbackPtr> fifo;  // Stream: callbacks launched, not yet run, in stream order
  CallbackPtr fixed;             // Graph: the captured callback; only the worker resets it
};

class SlotTable {
 public:
  SlotTable(std::shared_ptr<Device> device, std::uint32_t limit)
      : device_(std::move(device)), limit_(limit), info_(new SlotInfo[limit]), used_(limit, false) {}

  ~SlotTable() {
    if (lines_ != nullptr) device_->free_flags(mem_);
  }
  SlotTable(const SlotTable&) = delete;
  SlotTable& operator=(const SlotTable&) = delete;

  Status init() {
    Status st = device_->alloc_flags(static_cast<std::size_t>(limit_) * kFlagStride, &mem_);
    if (!st.ok()) return st;
    lines_ = static_cast<FlagLine*>(mem_.host);
    for (std::uint32_t i = 0; i < limit_; ++i) new (&lines_[i]) FlagLine();
    return st;
  }

  // The queue ring answers with sequence numbers: a new slot's flag starts at the count served so
  // far, below every number still to come.
  void set_idle_flag(const std::atomic<std::uint32_t>* served) { idle_source_ = served; }

  FlagLine& line(std::uint32_t i) { return lines_[i]; }
  SlotInfo& info(std::uint32_t i) { return info_[i]; }
  std::uint64_t device_addr(std::uint32_t i) const { return mem_.device + static_cast<std::uint64_t>(i) * kFlagStride; }
  // Slots at or above this index have never been used: the worker scans below it.
  std::uint32_t high_water() const { return high_water_.load(std::memory_order_acquire); }
  std::uint32_t limit() const { return limit_; }

  Status stream_slot(StreamHandle stream, std::uint32_t* out) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = streams_.find(stream);
    if (it != streams_.end()) {
      *out = it->second;
      return Status::success();
    }
    Status st = allocate_locked(out);
    if (!st.ok()) return st;
    SlotInfo& s = info_[*out];
    s.stream = stream;
    s.kind.store(static_cast<int>(SlotKind::Stream), std::memory_order_release);
    streams_.emplace(stream, *out);
    ++stream_slots_;
    return st;
  }

  Status graph_slot(CallbackPtr cb, std::uint32_t* out) {
    std::lock_guard<std::mutex> lock(mu_);
    Status st = allocate_locked(out);
    if (!st.ok()) return st;
    SlotInfo& s = info_[*out];
    s.fixed = std::move(cb);
    s.kind.store(static_cast<int>(SlotKind::Graph), std::memory_order_release);
    graph_slots_.fetch_add(1);  // seq_cst: pairs with the sleeping worker's check
    return st;
  }

  // Worker only: the graph that held slot i is gone, so the stream never touches it again.
  void free_graph_slot(std::uint32_t i) {
    SlotInfo& s = info_[i];
    s.fixed.reset();
    lines_[i].state.store(kFlagIdle, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu_);
    s.kind.store(static_cast<int>(SlotKind::Free), std::memory_order_release);
    used_[i] = false;
    --in_use_;
    graph_slots_.fetch_sub(1);
  }

  std::int64_t graph_slots() const { return graph_slots_.load(); }

  struct Usage {
    std::int64_t in_use = 0, streams = 0, graphs = 0;
  };
  Usage usage() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {static_cast<std::int64_t>(in_use_), static_cast<std::int64_t>(stream_slots_), graph_slots()};
  }

 private:
  Status allocate_locked(std::uint32_t* out) {
    for (std::uint32_t i = 0; i < limit_; ++i) {  // lowest free first keeps the scan short
      if (used_[i]) continue;
      used_[i] = true;
      ++in_use_;
      lines_[i].state.store(idle_source_ != nullptr ? idle_source_->load() : kFlagIdle, std::memory_order_release);
      if (i + 1 > high_water_.load(std::memory_order_relaxed)) {
        high_water_.store(i + 1, std::memory_order_release);
      }
      *out = i;
      return Status::success();
    }
    return Status::failure("doorbell host dispatch has no free flag slot: " + std::to_string(in_use_) + " of " +
                           std::to_string(limit_) + " in use (" + std::to_string(stream_slots_) + " by streams, " +
                           std::to_string(graph_slots()) +
                           " by callbacks in live CUDA graphs); destroy graphs that are no longer "
                           "needed or raise max_slots");
  }

  std::shared_ptr<Device> device_;
  const std::uint32_t limit_;
  FlagMemory mem_;
  FlagLine* lines_ = nullptr;
  const std::atomic<std::uint32_t>* idle_source_ = nullptr;
  std::unique_ptr<SlotInfo[]> info_;
  mutable std::mutex mu_;
  std::vector<bool> used_;
  std::uint32_t in_use_ = 0;
  std::uint32_t stream_slots_ = 0;
  std::atomic<std::int64_t> graph_slots_{0};
  std::atomic<std::uint32_t> high_water_{0};
  std::unordered_map<StreamHandle, std::uint32_t> streams_;
};

}  // namespace fastpath::hostdispatch
