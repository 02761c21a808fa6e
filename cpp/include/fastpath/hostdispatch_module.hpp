// The Python module every host-dispatch extension defines. The native binding passes
// RuntimeModePolicy (the mode is an argument); a generated extension passes a FixedModePolicy,
// so its mode is fixed at compile time and backends its mode cannot reach are not compiled.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fastpath/callback.hpp"
#include "fastpath/cuda_probe.hpp"
#include "fastpath/engine.hpp"
#include "fastpath/py_engine.hpp"
#include "fastpath/py_sim_bindings.hpp"
#include "fastpath/guided_fill.hpp"
#include "fastpath/token_ready_flag.hpp"

namespace fastpath::hostdispatch {

namespace py = pybind11;

template <class Policy>
Mode requested_mode(const std::optional<std::string>& mode) {
  if (!mode) return Policy::kMode;
  const std::optional<Mode> m = parse_mode(*mode);
  if (!m) throw py::value_error("mode must be one of inline, blocking, spin, auto; not '" + *mode + "'");
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
  if (!p) throw py::value_error("on_unsupported must be 'warn_once' or 'error', not '" + *on_unsupported + "'");
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
  for (Backend b : {Backend::Inline, Backend::Blocking, Backend::HostFuncV2, Backend::Doorbell}) {
    if (Policy::compiled(b)) out.append(name_of(b));
  }
  return py::tuple(out);
}

template <class Policy>
void define_module(py::module_& m, Policy policy) {
  m.attr("FIXED_MODE") = Policy::kFixed ? py::object(py::str(name_of(Policy::kMode))) : py::object(py::none());
  m.attr("FIXED_ON_UNSUPPORTED") =
      Policy::kFixed ? py::object(py::str(name_of(Policy::kOnUnsupported))) : py::object(py::none());
  py::list modes;
  for (Mode mode : {Mode::Inline, Mode::Blocking, Mode::Spin, Mode::Auto}) {
    if (!Policy::kFixed || mode == Policy::kMode) modes.append(name_of(mode));
  }
  m.attr("MODES") = py::tuple(modes);
  m.attr("BACKENDS") = compiled_backends<Policy>();

  // Local: another host-dispatch extension in the same process registers the same C++ types.
  py::register_local_exception<UnsupportedModeError>(m, "UnsupportedModeError", PyExc_RuntimeError);

  m.def("cuda_available", &cuda_available,
        "True when a CUDA driver is loadable and a device is visible. Never called at import.");
  m.def("build_info", [] {
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
    d["fixed_mode"] = Policy::kFixed ? py::object(py::str(name_of(Policy::kMode))) : py::object(py::none());
    d["backends"] = compiled_backends<Policy>();
    return d;
  });
  m.def("cuda_versions", [] {
    const CudaVersions v = cuda_versions();
    py::dict d;
    d["runtime"] = v.runtime;
    d["driver"] = v.driver;
    return d;
  });
  m.def(
      "probe",
      [](const py::object& device) {
        DeviceChoice choice = resolve_device(device);
        if (!choice.device) return capabilities_dict(capabilities_without_device(choice.no_device_reason));
        Capabilities caps;
        {
          py::gil_scoped_release unlocked;
          caps = choice.device->probe();
        }
        return capabilities_dict(caps);
      },
      py::arg("device") = "cuda", "What a device supports, self-tested: the spin chain's input.");
  m.def(
      "select_backend",
      [](const std::string& mode, const std::string& on_unsupported, const py::dict& caps) {
        const std::optional<Mode> mo = parse_mode(mode);
        const std::optional<OnUnsupported> p = parse_on_unsupported(on_unsupported);
        if (!mo || !p) throw py::value_error("unknown mode or on_unsupported");
        const Selection s = select_backend(*mo, *p, capabilities_from(caps));
        py::dict d;
        d["backend"] = name_of(s.backend);
        d["reason"] = s.reason;
        d["fallback"] = s.fallback.empty() ? py::object(py::none()) : py::object(py::str(s.fallback));
        return d;
      },
      py::arg("mode"), py::arg("on_unsupported"), py::arg("capabilities"),
      "The spin chain on given capabilities (keys cuda, hostfunc_v2, memops, their *_reason, versions).");
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

  define_sim_classes(m);

  py::class_<MatcherApi, std::shared_ptr<MatcherApi>>(
      m, "MatcherApi", py::module_local(), "tvm-ffi's entry points and xgrammar's matcher methods, by address.")
      .def(py::init([](std::uintptr_t call, std::uintptr_t inc_ref, std::uintptr_t dec_ref, std::uintptr_t move_error,
                       std::uintptr_t accept_token, std::uintptr_t is_terminated, std::uintptr_t fill) {
             for (std::uintptr_t p : {call, inc_ref, dec_ref, move_error, accept_token, is_terminated, fill}) {
               if (p == 0) throw py::value_error("MatcherApi: every address must be non-zero");
             }
             auto api = std::make_shared<MatcherApi>();
             api->call = reinterpret_cast<tvm_ffi_abi::FunctionCall>(call);
             api->inc_ref = reinterpret_cast<tvm_ffi_abi::ObjectRefFn>(inc_ref);
             api->dec_ref = reinterpret_cast<tvm_ffi_abi::ObjectRefFn>(dec_ref);
             api->move_error = reinterpret_cast<tvm_ffi_abi::ErrorMoveFromRaised>(move_error);
             api->accept_token = reinterpret_cast<void*>(accept_token);
             api->is_terminated = reinterpret_cast<void*>(is_terminated);
             api->fill_next_token_bitmask = reinterpret_cast<void*>(fill);
             return api;
           }),
           py::arg("call"), py::arg("inc_ref"), py::arg("dec_ref"), py::arg("move_error"), py::arg("accept_token"),
           py::arg("is_terminated"), py::arg("fill_next_token_bitmask"));

  py::class_<GuidedRow, std::shared_ptr<GuidedRow>>(m, "GuidedRow", py::module_local(),
                                                    "A guided request's xgrammar matcher, driven without the GIL.")
      .def(py::init([](std::shared_ptr<MatcherApi> api, std::uintptr_t matcher) {
             if (matcher == 0) throw py::value_error("GuidedRow: the matcher handle is null");
             return std::make_shared<GuidedRow>(std::move(api), matcher);
           }),
           py::arg("api"), py::arg("matcher"))
      .def("accept", &GuidedRow::accept, py::arg("token"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("accepted", &GuidedRow::accepted)
      .def_property_readonly("terminated", &GuidedRow::terminated)
      .def_property_readonly("live", &GuidedRow::live)
      .def_property_readonly("error", [](const GuidedRow& r) -> py::object {
        std::string e = r.error();
        return e.empty() ? py::object(py::none()) : py::object(py::str(e));
      });

  // None in a plan is a free row.
  auto to_plan = [](const GuidedFill& f, const py::list& rows) {
    if (static_cast<std::int64_t>(rows.size()) > f.max_rows()) {
      throw py::value_error("a row plan of " + std::to_string(rows.size()) + " rows; this fill holds " +
                            std::to_string(f.max_rows()));
    }
    RowPlan plan;
    plan.reserve(rows.size());
    for (const py::handle& r : rows) plan.push_back(r.is_none() ? nullptr : r.cast<std::shared_ptr<GuidedRow>>());
    return plan;
  };
  py::class_<GuidedFill, std::shared_ptr<GuidedFill>>(
      m, "GuidedFill", py::module_local(), "Each decode step's bitmask, filled by a C++ host callback from a queue of row plans.")
      .def(py::init([](const py::object& tokens, const py::object& mask, const py::object& flags, std::int64_t max_rows,
                       std::int64_t words) {
             // Contiguous CPU tensors (pinned where a GPU reads them): int64 [max_rows], int32
             // [max_rows, words], int32 [max_rows]. The fill keeps them alive.
             auto check = [](const py::object& t, std::int64_t numel, std::int64_t itemsize, const char* what) {
               const bool ok = t.attr("device").attr("type").cast<std::string>() == "cpu" &&
                               t.attr("is_contiguous")().cast<bool>() && t.attr("numel")().cast<std::int64_t>() == numel &&
                               t.attr("element_size")().cast<std::int64_t>() == itemsize;
               if (!ok) throw py::value_error(std::string("GuidedFill: ") + what + " is not a contiguous CPU tensor of the expected size");
               return t.attr("data_ptr")().cast<std::uintptr_t>();
             };
             const std::uintptr_t t = check(tokens, max_rows, 8, "tokens");
             const std::uintptr_t m = check(mask, max_rows * words, 4, "mask");
             const std::uintptr_t f = check(flags, max_rows, 4, "flags");
             PyObject* keep = py::make_tuple(tokens, mask, flags).release().ptr();
             std::shared_ptr<void> owner(keep, [](void* p) { PyGraveyard::instance().bury(static_cast<PyObject*>(p)); });
             return std::make_shared<GuidedFill>(t, m, f, max_rows, words, std::move(owner));
           }),
           py::arg("tokens"), py::arg("mask"), py::arg("flags"), py::arg("max_rows"), py::arg("words"))
      .def(
          "enqueue",
          [to_plan](GuidedFill& f, const py::list& rows) {
            PyGraveyard::instance().reap();
            f.enqueue(to_plan(f, rows));
          },
          py::arg("rows"), "The row plan of the next launched step.")
      .def("take_errors", &GuidedFill::take_errors, "Failures since the last call (a step with no plan, xgrammar errors).")
      .def(
          "fill",
          [to_plan](GuidedFill& f, const py::list& rows) {
            RowPlan plan = to_plan(f, rows);
            py::gil_scoped_release unlocked;
            f.fill(plan);
          },
          py::arg("rows"), "Fill these rows now, on this thread (a prefill's rows).")
      .def_property_readonly("fills", &GuidedFill::fills)
      .def_property_readonly("step_seconds", &GuidedFill::step_seconds)
      .def_property_readonly("missing_plans", &GuidedFill::missing_plans)
      .def_property_readonly("queued", &GuidedFill::queued);

  py::class_<PyEngine>(m, "Engine", py::module_local(), "Host callbacks on a stream, through the backend the spin chain picked.")
      .def(py::init([policy](std::optional<std::string> mode, std::optional<std::string> on_unsupported,
                             const py::object& device, std::uint32_t max_slots, double spin_budget_us,
                             double backoff_poll_us, double safety_poll_us, std::vector<std::string> simulate_absent,
                             bool hold_gil_during_launch, const std::string& ring, std::uint32_t queue_entries,
                             bool programmatic_launch) {
             EngineSettings s;
             s.options.mode = requested_mode<Policy>(mode);
             s.options.on_unsupported = requested_policy<Policy>(on_unsupported);
             if (max_slots < 1) throw py::value_error("max_slots must be at least 1");
             s.options.doorbell.max_slots = max_slots;
             s.options.doorbell.spin_budget_ns = static_cast<std::int64_t>(spin_budget_us * 1e3);
             s.options.doorbell.backoff_poll_ns = static_cast<std::int64_t>(backoff_poll_us * 1e3);
             s.options.doorbell.safety_poll_ns = static_cast<std::int64_t>(safety_poll_us * 1e3);
             s.options.simulate_absent = std::move(simulate_absent);
             if (!parse_ring(ring, &s.options.doorbell.ring)) {
               throw py::value_error("ring must be auto, queue, kernel, batched or memops, not '" + ring + "'");
             }
             if (Status st = check_queue_entries(queue_entries); !st.ok()) throw py::value_error(st.error);
             s.options.doorbell.queue_entries = queue_entries;
             s.options.doorbell.programmatic_launch = programmatic_launch;
             s.hold_gil_during_launch = hold_gil_during_launch;
             return std::make_unique<PyEngine>(s, device, policy);
           }),
           py::arg("mode") = py::none(), py::arg("on_unsupported") = py::none(), py::arg("device") = "cuda",
           py::kw_only(), py::arg("max_slots") = 1024, py::arg("spin_budget_us") = 10000.0,
           py::arg("backoff_poll_us") = 50.0, py::arg("safety_poll_us") = 5000.0,
           py::arg("simulate_absent") = std::vector<std::string>{}, py::arg("hold_gil_during_launch") = false,
           py::arg("ring") = "auto", py::arg("queue_entries") = 4096, py::arg("programmatic_launch") = true)
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
          "A C++ callback (no GIL) that appends tag to log.")
      .def(
          "launch_guided_fill",
          [](PyEngine& e, StreamHandle stream, std::shared_ptr<GuidedFill> fill) {
            e.launch(stream, std::make_shared<GuidedFillStep>(std::move(fill)));
          },
          py::arg("stream"), py::arg("fill"), "A C++ callback (no GIL) that runs fill's next step.")
      .def("capture_id", &PyEngine::capture_id, py::arg("stream"))
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
      .def_property_readonly("fallback", [](const PyEngine& e) -> py::object {
        const std::string& f = e.selection().fallback;
        return f.empty() ? py::object(py::none()) : py::object(py::str(f));
      })
      .def_property_readonly("has_device", &PyEngine::has_device);
}

}  // namespace fastpath::hostdispatch
