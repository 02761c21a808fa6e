// An engine: the backend the spin chain picked for a device, plus capture bookkeeping.
// Which backends a build contains is a template argument, so a mode-fixed extension compiles
// only the ones its mode can end on.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fastpath/backend.hpp"
#include "fastpath/cuda_probe.hpp"
#include "fastpath/dispatch_mode.hpp"
#include "fastpath/doorbell_backend.hpp"
#include "fastpath/hostfunc_backend.hpp"
#include "fastpath/inline_backend.hpp"

namespace fastpath::hostdispatch {

struct EngineOptions {
  Mode mode = Mode::Auto;
  OnUnsupported on_unsupported = OnUnsupported::WarnOnce;
  DoorbellOptions doorbell;
  std::vector<std::string> simulate_absent;  // test hook: "hostfunc_v2" and/or "memops"
};

// The native binding: every mode, chosen at run time.
struct RuntimeModePolicy {
  static constexpr bool kFixed = false;
  static constexpr Mode kMode = Mode::Auto;
  static constexpr OnUnsupported kOnUnsupported = OnUnsupported::WarnOnce;
  static constexpr bool compiled(Backend) { return true; }
};

// A generated extension: one mode, fixed at compile time.
template <Mode M, OnUnsupported P>
struct FixedModePolicy {
  static_assert(M != Mode::Inline, "a generated extension fixes blocking, spin or auto");
  static constexpr bool kFixed = true;
  static constexpr Mode kMode = M;
  static constexpr OnUnsupported kOnUnsupported = P;
  static constexpr bool compiled(Backend b) { return mode_may_use(M, b); }
};

inline void check_simulated_absence(const std::vector<std::string>& absent) {
  for (const std::string& what : absent) {
    if (what != "hostfunc_v2" && what != "memops") {
      throw std::invalid_argument("simulate_absent takes 'hostfunc_v2' and 'memops', not '" + what + "'");
    }
  }
}

inline Capabilities apply_simulated_absence(Capabilities caps, const std::vector<std::string>& absent) {
  for (const std::string& what : absent) {
    Capability& c = what == "hostfunc_v2" ? caps.hostfunc_v2 : caps.memops;
    c.available = false;
    c.reason = "simulated absent (test hook)";
  }
  return caps;
}

inline Capabilities capabilities_without_device(const std::string& reason) {
  Capabilities caps;
  caps.cuda.reason = reason;
  caps.hostfunc_v2.reason = caps.memops.reason = "no device";
  caps.runtime_version = kCudaRuntimeBuildVersion;
  return caps;
}

template <class Policy>
std::unique_ptr<BackendImpl> make_backend(Backend b, const std::shared_ptr<Device>& device, const EngineOptions& opts) {
  switch (b) {
    case Backend::Inline:
      return std::make_unique<InlineBackend>(device);
    case Backend::Blocking:
      if constexpr (Policy::compiled(Backend::Blocking)) return std::make_unique<HostFuncBackend>(device, false);
      break;
    case Backend::HostfuncV2:
      if constexpr (Policy::compiled(Backend::HostfuncV2)) return std::make_unique<HostFuncBackend>(device, true);
      break;
    case Backend::Doorbell:
      if constexpr (Policy::compiled(Backend::Doorbell)) {
        Status st;
        auto backend = DoorbellBackend::create(device, opts.doorbell, &st);
        if (!backend) throw std::runtime_error("doorbell host dispatch could not start: " + st.error);
        return backend;
      }
      break;
  }
  throw std::logic_error(std::string("backend '") + name_of(b) + "' is not compiled into this extension");
}

class Engine {
 public:
  // device null: no CUDA here (no_device_reason says why); every mode runs inline.
  template <class Policy>
  static std::unique_ptr<Engine> create(const EngineOptions& opts, std::shared_ptr<Device> device,
                                        const std::string& no_device_reason, Policy) {
    check_simulated_absence(opts.simulate_absent);
    Capabilities caps = device ? apply_simulated_absence(device->probe(), opts.simulate_absent)
                               : capabilities_without_device(no_device_reason);
    Selection sel = select_backend(opts.mode, opts.on_unsupported, caps);
    if (!caps.cuda.available) device.reset();  // a device that cannot run CUDA work runs inline
    auto backend = make_backend<Policy>(sel.backend, device, opts);
    return std::unique_ptr<Engine>(new Engine(std::move(device), std::move(caps), std::move(sel), std::move(backend)));
  }

  ~Engine() { backend_->detach(); }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Called without the GIL.
  Status launch(StreamHandle stream, CallbackPtr cb, bool* captured = nullptr) {
    if (captured != nullptr) *captured = false;
    if (!device_) return backend_->launch(stream, std::move(cb));
    CaptureState cs;
    Status st = device_->capture_state(stream, &cs);
    if (!st.ok()) return st;
    if (!cs.capturing) return backend_->launch(stream, std::move(cb));
    if (captured != nullptr) *captured = true;
    st = backend_->launch_captured(stream, std::move(cb));
    if (st.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      ++captures_[cs.id];
    }
    return st;
  }

  // The id of the capture running on `stream`, if any.
  std::optional<std::uint64_t> capture_id(StreamHandle stream) {
    if (!device_) return std::nullopt;
    CaptureState cs;
    Status st = device_->capture_state(stream, &cs);
    if (!st.ok()) throw std::runtime_error(st.error);
    if (!cs.capturing) return std::nullopt;
    return cs.id;
  }

  // How many callbacks were captured under `capture_id`; forgets the capture.
  std::int64_t take_capture(std::uint64_t capture_id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = captures_.find(capture_id);
    if (it == captures_.end()) return 0;
    const std::int64_t n = it->second;
    captures_.erase(it);
    return n;
  }

  void announce(std::int64_t callbacks) { backend_->announce(callbacks); }
  ShutdownOutcome shutdown(std::chrono::nanoseconds bound) { return backend_->shutdown(bound); }
  BackendStats stats() const { return backend_->stats(); }
  const Selection& selection() const { return selection_; }
  const Capabilities& capabilities() const { return caps_; }
  bool has_device() const { return static_cast<bool>(device_); }
  std::string device_name() const { return device_ ? device_->name() : std::string("none"); }
  Status synchronize(StreamHandle stream) {
    Status st = device_ ? device_->synchronize(stream) : Status::success();
    if (st.ok()) backend_->wait_posted();
    return st;
  }

 private:
  Engine(std::shared_ptr<Device> device, Capabilities caps, Selection sel, std::unique_ptr<BackendImpl> backend)
      : device_(std::move(device)), caps_(std::move(caps)), selection_(std::move(sel)), backend_(std::move(backend)) {}

  std::shared_ptr<Device> device_;
  Capabilities caps_;
  Selection selection_;
  std::unique_ptr<BackendImpl> backend_;
  std::mutex mu_;
  std::unordered_map<std::uint64_t, std::int64_t> captures_;
};

}  // namespace fastpath::hostdispatch
