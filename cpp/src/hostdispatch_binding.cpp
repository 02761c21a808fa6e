// fastpath.runtime._hostdispatch: the native binding, with the dispatch mode chosen at run time and
// guided fill compiled in. Generated extensions define the same module with the mode fixed, and
// guided fill only where their manifest uses it (templates/hostdispatch.cpp.j2).
#include <pybind11/pybind11.h>

#include "fastpath/dispatch_module.hpp"
#include "fastpath/guided_module.hpp"

PYBIND11_MODULE(_hostdispatch, m) {
  namespace hd = fastpath::hostdispatch;
  m.doc() = "fastpath host dispatch (native binding; mode chosen at run time)";
  auto engine = hd::define_dispatch(m, hd::RuntimeModePolicy{});
  hd::define_guided_fill(m, engine);
}
