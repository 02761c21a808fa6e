// The Python module every host-dispatch extension defines: the engine, the spin chain, and the
// C++ callbacks of dispatch itself (token-ready flags, call logs). The native binding passes
// RuntimeModePolicy (the mode is an argument); a generated extension passes a FixedModePolicy,
// so its mode is fixed at compile time and backends its mode cannot reach are not compiled.
// Guided fill (guided_module.hpp) is added where it is used; the simulated device lives in a
// test-only extension (cpp/sim) and reaches an engine through py_device.hpp.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fastpath/callback.hpp"
#include "fastpath/cuda_probe.hpp"
#include "fastpath/engine.hpp"
#include "fastpath/py_engine.hpp"
#include "fastpath/token_ready_flag.hpp"

namespace fastpath::hostdispatch {

namespace py = pybind11;

template <class Enum, std::size_t N>
std::string joined_names(const Enum (&values)[N]) {
  std::string out;
  for (Enum v : values) out += (out.empty() ? "" : ", ") + std::string(name_of(v));
  return out;
}

template <class Policy>
Mode requested_mode(const std::optional<std::string>& mode) {
  if (!mode) return Policy::kMode;
  const std::optional<Mode> m = parse_mode(*mode);
  if (!m) throw py::value_error("mode must be one of " + joined_names(kModes) + "; not '" + *mode + "'");
  if (Policy::kFixed && *m != Policy::kMode) {
    throw py::value_error(std::string("this extension is compiled for mode '") + name_of(Policy::kMode) +
                          "'; it cannot run '" + *mode + "'");
  }
  return *m;
}

template <class Policy>
OnUnsupported requested_policy(const std::optional<std::string>& on_unsupported) {
  if (!on_unsupported) return Policy::kOnUnsupported;
  const std::optional<OnUnsupported> p = parse_on_unsupported(*on_unsupported);
  if (!p) {
    throw py::value_error("on_unsupported must be one of " + joined_names(kPolicies) + "; not '" +
                          *on_unsupported + "'");
  }
  if (Policy::kFixed && *p != Policy::kOnUnsupported) {
    throw py::value_error(std::string("this extension is compiled with on_unsupported='") +
                          name_of(Policy::kOnUnsupported) + "'");
  }
  return *p;
}

inline Capabilities capabilities_from(const py::dict& d) {
  auto flag = [&](const char* key, Capability* c) {
    c->available = d.contains(key) && py::cast<bool>(d[key]);
    const std::string reason_key = std::string(key) + "_reason";
    c->reason = d.contains(reason_key.c_str()) ? py::cast<std::string>(d[reason_key.c_str()]) : "absent";
  };
  Capabilities caps;
  flag("cuda", &caps.cuda);
  flag("hostfunc_v2", &caps.hostfunc_v2);
  flag("memops", &caps.memops);
  if (d.contains("runtime_version")) caps.runtime_version = py::cast<int>(d["runtime_version"]);
  if (d.contains("driver_version")) caps.driver_version = py::cast<int>(d["driver_version"]);
  return caps;
}

template <class Policy>
py::tuple compiled_backends() {
  py::list out;
  for (Backend b : kBackends) {
    if (Policy::compiled(b)) out.append(name_of(b));
  }
  return py::tuple(out);
}

template <class Policy, class Enum>
py::object fixed_name(Enum value) {
  return Policy::kFixed ? py::object(py::str(name_of(value))) : py::object(py::none());
}

inline py::object none_if_empty(const std::string& s) { return s.empty() ? py::object(py::none()) : py::object(py::str(s)); }

template <class Policy>
void define_constants(py::module_& m) {
  m.attr("FIXED_MODE") = fixed_name<Policy>(Policy::kMode);
  m.attr("FIXED_ON_UNSUPPORTED") = fixed_name<Policy>(Policy::kOnUnsupported);
  py::list modes;
  for (Mode mode : kModes) {
    if (!Policy::kFixed || mode == Policy::kMode) modes.append(name_of(mode));
  }
  m.attr("MODES") = py::tuple(modes);
  m.attr("BACKENDS") = compiled_backends<Policy>();
  // Local: another host-dispatch extension in the same process registers the same C++ types.
  py::register_local_exception<UnsupportedModeError>(m, "UnsupportedModeError", PyExc_RuntimeError);
}

template <class Policy>
py::dict build_info() {
  py::dict d;
  d["cuda"] = kBuiltWithCuda;
  d["cuda_runtime_build_version"] = kCudaRuntimeBuildVersion;
  d["cudart"] = kBuiltWithCuda ? "static" : "none";
#if defined(__clang__)
  d["compiler"] = "clang " __clang_version__;
#elif defined(__GNUC__)
  d["compiler"] = "gcc " __VERSION__;
#else
  d["compiler"] = "unknown";
#endif
  d["fixed_mode"] = fixed_name<Policy>(Policy::kMode);
  d["backends"] = compiled_backends<Policy>();
  return d;
}

inline py::dict probe_device(const py::object& device) {
  DeviceChoice choice = resolve_device(device);
  if (!choice.device) return capabilities_dict(capabilities_without_device(choice.no_device_reason));
  Capabilities caps;
  {
    py::gil_scoped_release unlocked;
    caps = choice.device->probe();
  }
  return capabilities_dict(caps);
}

inline py::dict select_backend_on(const std::string& mode, const std::string& on_unsupported, const py::dict& caps) {
  const std::optional<Mode> mo = parse_mode(mode);
  const std::optional<OnUnsupported> p = parse_on_unsupported(on_unsupported);
  if (!mo || !p) throw py::value_error("unknown mode or on_unsupported");
  const Selection s = select_backend(*mo, *p, capabilities_from(caps));
  py::dict d;
  d["backend"] = name_of(s.backend);
  d["reason"] = s.reason;
  d["fallback"] = none_if_empty(s.fallback);
  return d;
}

template <class Policy>
void define_functions(py::module_& m) {
  m.def("cuda_available", &cuda_available,
        "True when a CUDA driver is loadable and a device is visible. Never called at import.");
  m.def("build_info", &build_info<Policy>);
  m.def("cuda_versions", [] {
    const CudaVersions v = cuda_versions();
    py::dict d;
    d["runtime"] = v.runtime;
    d["driver"] = v.driver;
    return d;
  });
  m.def("probe", &probe_device, py::arg("device") = "cuda", "What a device supports, self-tested: the spin chain's input.");
  m.def("select_backend", &select_backend_on, py::arg("mode"), py::arg("on_unsupported"), py::arg("capabilities"),
        "The spin chain on given capabilities (keys cuda, hostfunc_v2, memops, their *_reason, versions).");
}

inline void define_lifetime_functions(py::module_& m) {
  m.def("live_callbacks", [] { return Callback::live_count().load(); },
        "Host callbacks alive in this extension, Python and C++: a leak shows here.");
  m.def("reap", [] { PyGraveyard::instance().reap(); },
        "Drop Python references released on threads without the GIL (not while a capture is counted).");
  m.def("graveyard_size", [] { return PyGraveyard::instance().size(); },
        "Python references released without the GIL and not yet dropped.");
  m.def(
      "_shutdown_at_exit",
      [](double timeout_s) {
        py::gil_scoped_release unlocked;
        ExitRegistry::instance().stop_all(std::chrono::nanoseconds(static_cast<std::int64_t>(timeout_s * 1e9)));
      },
      py::arg("timeout") = 2.0, "Stops every engine's callbacks; registered with atexit.");
  // Before the interpreter finalizes, no dispatch thread may still be running Python.
  py::module_::import("atexit").attr("register")(m.attr("_shutdown_at_exit"));
}

inline void define_cpp_callbacks(py::module_& m) {
  py::class_<TokenReadyFlag, std::shared_ptr<TokenReadyFlag>>(
      m, "TokenReadyFlag", py::module_local(), "Step k's tokens are ready: marked by a C++ callback, awaited without the GIL.")
      .def(py::init<>())
      .def("advance", &TokenReadyFlag::advance)
      .def("mark", &TokenReadyFlag::mark, py::arg("step"))
      .def("reset", &TokenReadyFlag::reset, py::arg("ready") = 0)
      .def_property_readonly("ready_steps", &TokenReadyFlag::ready_steps)
      .def(
          "wait",
          [](TokenReadyFlag& f, std::int64_t step, std::optional<double> timeout) {
            py::gil_scoped_release unlocked;
            return f.wait(step, timeout ? *timeout : -1.0);
          },
          py::arg("step"), py::arg("timeout") = py::none(), "True once step is ready; False on timeout.");

  py::class_<CallLog, std::shared_ptr<CallLog>>(m, "CallLog", py::module_local(), "Tags appended by C++ callbacks, in run order.")
      .def(py::init<>())
      .def("tags", &CallLog::tags)
      .def("clear", &CallLog::clear)
      .def("__len__", &CallLog::size);
}

// Engine(...) as Python calls it; Policy is stateless, so a fresh one stands in for the module's.
template <class Policy>
std::unique_ptr<PyEngine> make_engine(std::optional<std::string> mode, std::optional<std::string> on_unsupported,
                                      const py::object& device, std::uint32_t max_slots, double spin_budget_us,
                                      double backoff_poll_us, double safety_poll_us,
                                      std::vector<std::string> simulate_absent, bool hold_gil_during_launch,
                                      const std::string& ring, std::uint32_t queue_entries, bool programmatic_launch) {
  EngineSettings s;
  s.options.mode = requested_mode<Policy>(mode);
  s.options.on_unsupported = requested_policy<Policy>(on_unsupported);
  if (max_slots < 1) throw py::value_error("max_slots must be at least 1");
  DoorbellOptions& door = s.options.doorbell;
  door.max_slots = max_slots;
  door.spin_budget_ns = static_cast<std::int64_t>(spin_budget_us * 1e3);
  door.backoff_poll_ns = static_cast<std::int64_t>(backoff_poll_us * 1e3);
  door.safety_poll_ns = static_cast<std::int64_t>(safety_poll_us * 1e3);
  s.options.simulate_absent = std::move(simulate_absent);
  if (!parse_ring(ring, &door.ring)) {
    throw py::value_error("ring must be auto, queue, kernel, batched or memops, not '" + ring + "'");
  }
  if (Status st = check_queue_entries(queue_entries); !st.ok()) throw py::value_error(st.error);
  door.queue_entries = queue_entries;
  door.programmatic_launch = programmatic_launch;
  s.hold_gil_during_launch = hold_gil_during_launch;
  return std::make_unique<PyEngine>(s, device, Policy{});
}

inline void define_engine_launches(py::class_<PyEngine>& engine) {
  engine
      .def("launch", &PyEngine::launch_python, py::arg("stream"), py::arg("fn"), py::kw_only(), py::arg("wait") = true,
           "Enqueue fn(*args) on the stream (eagerly, or into the graph being captured); wait=False posts it.")
      .def(
          "launch_token_ready",
          [](PyEngine& e, StreamHandle stream, std::shared_ptr<TokenReadyFlag> flag, std::optional<std::int64_t> step,
             bool wait) {
            CallbackPtr cb = step ? CallbackPtr(std::make_shared<MarkTokenStep>(std::move(flag), *step))
                                  : CallbackPtr(std::make_shared<AdvanceTokenFlag>(std::move(flag)));
            e.launch(stream, std::move(cb), wait);
          },
          py::arg("stream"), py::arg("flag"), py::arg("step") = py::none(), py::arg("wait") = true,
          "A C++ callback (no GIL) that marks `step` ready, or the next step when step is None.")
      .def(
          "launch_log",
          [](PyEngine& e, StreamHandle stream, std::shared_ptr<CallLog> log, std::int64_t tag, bool wait) {
            e.launch(stream, std::make_shared<AppendTag>(std::move(log), tag), wait);
          },
          py::arg("stream"), py::arg("log"), py::arg("tag"), py::arg("wait") = true,
          "A C++ callback (no GIL) that appends tag to log.");
}

inline void define_engine_state(py::class_<PyEngine>& engine) {
  engine.def("capture_id", &PyEngine::capture_id, py::arg("stream"))
      .def("take_capture", &PyEngine::take_capture, py::arg("capture_id"))
      .def("announce", &PyEngine::announce, py::arg("callbacks"))
      .def("synchronize", &PyEngine::synchronize, py::arg("stream"))
      .def("take_errors", &PyEngine::take_errors)
      .def("shutdown", &PyEngine::shutdown, py::arg("timeout") = 5.0)
      .def("info", &PyEngine::info)
      .def_property_readonly("backend", [](const PyEngine& e) { return name_of(e.selection().backend); })
      .def_property_readonly("mode", [](const PyEngine& e) { return name_of(e.selection().mode); })
      .def_property_readonly("on_unsupported", [](const PyEngine& e) { return name_of(e.selection().on_unsupported); })
      .def_property_readonly("reason", [](const PyEngine& e) { return e.selection().reason; })
      .def_property_readonly("fallback", [](const PyEngine& e) { return none_if_empty(e.selection().fallback); })
      .def_property_readonly("has_device", &PyEngine::has_device);
}

template <class Policy>
py::class_<PyEngine> define_engine(py::module_& m) {
  py::class_<PyEngine> engine(m, "Engine", py::module_local(),
                              "Host callbacks on a stream, through the backend the spin chain picked.");
  engine.def(py::init(&make_engine<Policy>), py::arg("mode") = py::none(), py::arg("on_unsupported") = py::none(),
             py::arg("device") = "cuda", py::kw_only(), py::arg("max_slots") = 1024,
             py::arg("spin_budget_us") = 10000.0, py::arg("backoff_poll_us") = 50.0,
             py::arg("safety_poll_us") = 5000.0, py::arg("simulate_absent") = std::vector<std::string>{},
             py::arg("hold_gil_during_launch") = false, py::arg("ring") = "auto", py::arg("queue_entries") = 4096,
             py::arg("programmatic_launch") = true);
  define_engine_launches(engine);
  define_engine_state(engine);
  return engine;
}

// Everything but guided fill; returns the Engine class so define_guided_fill can add its launch.
template <class Policy>
py::class_<PyEngine> define_dispatch(py::module_& m, Policy) {
  define_constants<Policy>(m);
  define_functions<Policy>(m);
  define_lifetime_functions(m);
  define_cpp_callbacks(m);
  return define_engine<Policy>(m);
}

}  // namespace fastpath::hostdispatch
