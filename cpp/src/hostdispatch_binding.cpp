// fastpath.runtime._hostdispatch: the native binding, with the dispatch mode chosen at run time.
// Generated extensions define the same module with the mode fixed (templates/hostdispatch.cpp.j2).
#include <pybind11/pybind11.h>

#include "fastpath/hostdispatch_module.hpp"

PYBIND11_MODULE(_hostdispatch, m) {
  m.doc() = "fastpath host dispatch (native binding; mode chosen at run time)";
  fastpath::hostdispatch::define_module(m, fastpath::hostdispatch::RuntimeModePolicy{});
}
