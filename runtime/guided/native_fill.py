"""The guided fill as a C++ host callback (cpp/include/fastpath/guided_fill.hpp).

It calls xgrammar's matcher through tvm-ffi's C ABI and never takes the GIL, so each step's fill
runs beside the engine's Python thread instead of waiting for it. This module finds the entry
points: tvm-ffi's C functions by ctypes, xgrammar's methods from its tvm-ffi type information.
"""

from __future__ import annotations

import ctypes
from typing import Any


def matcher_api(extension: Any) -> Any | None:
    """`extension.MatcherApi` for the installed xgrammar, or None where it cannot be built here."""
    if not hasattr(extension, "MatcherApi"):
        return None
    try:
        import tvm_ffi.libinfo
        from xgrammar.tvm_ffi_binding import GrammarMatcher
    except ImportError:
        return None  # an xgrammar not built on tvm-ffi: the Python fill
    try:
        lib = ctypes.CDLL(tvm_ffi.libinfo.find_libtvm_ffi())
        methods = {m.name: m.func for m in GrammarMatcher.__tvm_ffi_type_info__.methods}

        def c_function(name: str) -> int:
            return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value

        return extension.MatcherApi(
            call=c_function("TVMFFIFunctionCall"),
            inc_ref=c_function("TVMFFIObjectIncRef"),
            dec_ref=c_function("TVMFFIObjectDecRef"),
            move_error=c_function("TVMFFIErrorMoveFromRaised"),
            accept_token=methods["accept_token"].__chandle__(),
            is_terminated=methods["is_terminated"].__chandle__(),
            fill_next_token_bitmask=methods["fill_next_token_bitmask"].__chandle__(),
        )
    except (OSError, AttributeError, KeyError, RuntimeError, TypeError, ValueError):
        return None


def matcher_handle(matcher: Any) -> int:
    """The address of an xgrammar GrammarMatcher's tvm-ffi object."""
    return matcher._handle.__chandle__()
