// Guided decoding's part of a host-dispatch module: xgrammar's matcher through tvm-ffi
// (MatcherApi, GuidedRow), the per-step bitmask fill (GuidedFill) and Engine.launch_guided_fill.
// Only extensions whose manifest decodes with a grammar compile it; without it the runtime fills
// the bitmask from Python (runtime/guided/python_fill.py).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "fastpath/guided_fill.hpp"
#include "fastpath/py_engine.hpp"
#include "fastpath/py_gil.hpp"

namespace fastpath::hostdispatch {

namespace py = pybind11;

inline std::shared_ptr<MatcherApi> make_matcher_api(std::uintptr_t call, std::uintptr_t inc_ref, std::uintptr_t dec_ref,
                                                    std::uintptr_t move_error, std::uintptr_t accept_token,
                                                    std::uintptr_t is_terminated, std::uintptr_t fill) {
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
}

inline void define_matcher(py::module_& m) {
  py::class_<MatcherApi, std::shared_ptr<MatcherApi>>(
      m, "MatcherApi", py::module_local(), "tvm-ffi's entry points and xgrammar's matcher methods, by address.")
      .def(py::init(&make_matcher_api), py::arg("call"), py::arg("inc_ref"), py::arg("dec_ref"), py::arg("move_error"),
           py::arg("accept_token"), py::arg("is_terminated"), py::arg("fill_next_token_bitmask"));

  py::class_<GuidedRow, std::shared_ptr<GuidedRow>>(m, "GuidedRow", py::module_local(),
                                                    "A guided request's xgrammar matcher, driven without the GIL.")
      .def(py::init([](std::shared_ptr<MatcherApi> api, std::uintptr_t matcher, std::int64_t gate) {
             if (matcher == 0) throw py::value_error("GuidedRow: the matcher handle is null");
             return std::make_shared<GuidedRow>(std::move(api), matcher, gate);
           }),
           py::arg("api"), py::arg("matcher"), py::arg("gate") = -1)
      .def("accept", &GuidedRow::accept, py::arg("token"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("accepted", &GuidedRow::accepted)
      .def_property_readonly("terminated", &GuidedRow::terminated)
      .def_property_readonly("live", &GuidedRow::live)
      .def_property_readonly("open", &GuidedRow::open)
      .def_property_readonly("error", [](const GuidedRow& r) -> py::object {
        std::string e = r.error();
        return e.empty() ? py::object(py::none()) : py::object(py::str(e));
      });
}

// Contiguous CPU tensors (pinned where a GPU reads them): int64 [max_rows], int32
// [max_rows, words], int32 [max_rows]. The fill keeps them alive.
inline std::shared_ptr<GuidedFill> make_guided_fill(const py::object& tokens, const py::object& mask,
                                                    const py::object& flags, std::int64_t max_rows, std::int64_t words,
                                                    int threads) {
  if (threads < 1 || threads > 64) throw py::value_error("GuidedFill: threads must be 1 to 64, not " + std::to_string(threads));
  auto check = [](const py::object& t, std::int64_t numel, std::int64_t itemsize, const char* what) {
    const bool ok = t.attr("device").attr("type").cast<std::string>() == "cpu" && t.attr("is_contiguous")().cast<bool>() &&
                    t.attr("numel")().cast<std::int64_t>() == numel &&
                    t.attr("element_size")().cast<std::int64_t>() == itemsize;
    if (!ok) throw py::value_error(std::string("GuidedFill: ") + what + " is not a contiguous CPU tensor of the expected size");
    return t.attr("data_ptr")().cast<std::uintptr_t>();
  };
  const std::uintptr_t t = check(tokens, max_rows, 8, "tokens");
  const std::uintptr_t m = check(mask, max_rows * words, 4, "mask");
  const std::uintptr_t f = check(flags, max_rows, 4, "flags");
  PyObject* keep = py::make_tuple(tokens, mask, flags).release().ptr();
  std::shared_ptr<void> owner(keep, [](void* p) { PyGraveyard::instance().bury(static_cast<PyObject*>(p)); });
  return std::make_shared<GuidedFill>(t, m, f, max_rows, words, std::move(owner), threads);
}

// A Python row plan as C++: None is a free row.
inline RowPlan row_plan(const GuidedFill& f, const py::list& rows) {
  if (static_cast<std::int64_t>(rows.size()) > f.max_rows()) {
    throw py::value_error("a row plan of " + std::to_string(rows.size()) + " rows; this fill holds " +
                          std::to_string(f.max_rows()));
  }
  RowPlan plan;
  plan.reserve(rows.size());
  for (const py::handle& r : rows) plan.push_back(r.is_none() ? nullptr : r.cast<std::shared_ptr<GuidedRow>>());
  return plan;
}

inline void define_fill(py::module_& m) {
  py::class_<GuidedFill, std::shared_ptr<GuidedFill>>(
      m, "GuidedFill", py::module_local(), "Each decode step's bitmask, filled by a C++ host callback from a queue of row plans.")
      .def(py::init(&make_guided_fill), py::arg("tokens"), py::arg("mask"), py::arg("flags"), py::arg("max_rows"),
           py::arg("words"), py::arg("threads") = 1)
      .def(
          "enqueue",
          [](GuidedFill& f, const py::list& rows) {
            PyGraveyard::instance().reap();
            f.enqueue(row_plan(f, rows));
          },
          py::arg("rows"), "The row plan of the next launched step.")
      .def("take_errors", &GuidedFill::take_errors, "Failures since the last call (a step with no plan, xgrammar errors).")
      .def(
          "fill",
          [](GuidedFill& f, const py::list& rows) {
            RowPlan plan = row_plan(f, rows);
            py::gil_scoped_release unlocked;
            f.fill(plan);
          },
          py::arg("rows"), "Fill these rows now, on this thread (a prefill's rows).")
      .def_property_readonly("fills", &GuidedFill::fills)
      .def_property_readonly("threads", &GuidedFill::threads)
      .def(
          "set_threads",
          [](GuidedFill& f, int threads) {
            if (threads < 1 || threads > 64) {
              throw py::value_error("GuidedFill.set_threads: threads must be 1 to 64, not " + std::to_string(threads));
            }
            py::gil_scoped_release unlocked;  // it may wait for a fill in progress
            f.set_threads(threads);
          },
          py::arg("threads"), "Spread later fills over this many threads (this one and a pool).")
      .def_property_readonly("steps", &GuidedFill::steps, "Decode steps filled (run_step calls that found a plan).")
      .def("step_durations_us", &GuidedFill::step_durations_us,
           "How long each of the last 4096 decode steps' fills took, oldest first.")
      .def_property_readonly("step_seconds", &GuidedFill::step_seconds)
      .def_property_readonly("missing_plans", &GuidedFill::missing_plans)
      .def_property_readonly("queued", &GuidedFill::queued);
}

// The guided classes, and Engine.launch_guided_fill on the class define_dispatch returned.
inline void define_guided_fill(py::module_& m, py::class_<PyEngine>& engine) {
  define_matcher(m);
  define_fill(m);
  engine.def(
      "launch_guided_fill",
      [](PyEngine& e, StreamHandle stream, std::shared_ptr<GuidedFill> fill) {
        e.launch(stream, std::make_shared<GuidedFillStep>(std::move(fill)));
      },
      py::arg("stream"), py::arg("fill"), "A C++ callback (no GIL) that runs fill's next step.");
}

}  // namespace fastpath::hostdispatch
