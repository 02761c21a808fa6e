// The spin chain: which backend serves a dispatch mode, given what the device supports. The
// names of modes, backends and policies come from fastpath.vocab (dispatch_names.hpp). Pure
// logic: no CUDA, no Python, so the chain is testable anywhere.
#pragma once

#include <stdexcept>
#include <string>

#include "fastpath/dispatch_names.hpp"

namespace fastpath::hostdispatch {

struct Capability {
  bool available = false;
  std::string reason;  // why it is missing, or how it was found
};

struct Capabilities {
  Capability cuda;         // a driver and a visible device
  Capability hostfunc_v2;  // cudaLaunchHostFunc_v2 with cudaHostTaskSpinWait
  Capability memops;       // cuStreamWriteValue32 / cuStreamWaitValue32 on mapped pinned memory
  int runtime_version = 0;
  int driver_version = 0;
};

// Raised where on_unsupported=error forbids the fall back to blocking.
class UnsupportedModeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Selection {
  Mode mode = Mode::Auto;
  OnUnsupported on_unsupported = OnUnsupported::WarnOnce;
  Backend backend = Backend::Inline;
  std::string reason;    // why this backend
  std::string fallback;  // set when "spin" fell back along its chain: the one warning to show
};

inline std::string version_text(int v) {
  if (v <= 0) return "unknown";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

// The spin chain: hostfunc_v2, then doorbell, then blocking. "auto" walks the same chain
// silently; "spin" reports any fall back once, and on_unsupported=error refuses to end on
// blocking, the one backend that does not spin.
inline Selection select_backend(Mode mode, OnUnsupported policy, const Capabilities& caps) {
  Selection s;
  s.mode = mode;
  s.on_unsupported = policy;
  if (mode == Mode::Inline) {
    s.backend = Backend::Inline;
    s.reason = "inline requested: callbacks run on the launching thread, in order";
    return s;
  }
  if (!caps.cuda.available) {
    s.backend = Backend::Inline;
    s.reason = "no CUDA (" + caps.cuda.reason + "): callbacks run inline, in order";
    return s;
  }
  if (mode == Mode::Blocking) {
    s.backend = Backend::Blocking;
    s.reason = "blocking requested: cudaLaunchHostFunc";
    return s;
  }
  const std::string versions =
      "runtime " + version_text(caps.runtime_version) + ", driver " + version_text(caps.driver_version);
  if (caps.hostfunc_v2.available) {
    s.backend = Backend::HostfuncV2;
    s.reason = "cudaLaunchHostFunc_v2 with cudaHostTaskSpinWait (" + versions + ")";
    return s;
  }
  const std::string v2_missing = "hostfunc_v2 unavailable: " + caps.hostfunc_v2.reason;
  if (caps.memops.available) {
    s.backend = Backend::Doorbell;
    s.reason = "doorbell on stream memory operations (" + v2_missing + ")";
    if (mode == Mode::Spin) {
      s.fallback = "host dispatch 'spin': " + v2_missing + "; using the doorbell backend";
    }
    return s;
  }
  const std::string both_missing = v2_missing + "; doorbell unavailable: " + caps.memops.reason;
  if (mode == Mode::Spin && policy == OnUnsupported::Error) {
    throw UnsupportedModeError("host dispatch 'spin' is unsupported here (" + both_missing +
                               ") and on_unsupported=error forbids falling back to blocking");
  }
  s.backend = Backend::Blocking;
  s.reason = "cudaLaunchHostFunc (" + both_missing + ")";
  if (mode == Mode::Spin) {
    s.fallback = "host dispatch 'spin': " + both_missing + "; falling back to blocking (cudaLaunchHostFunc)";
  }
  return s;
}

}  // namespace fastpath::hostdispatch
