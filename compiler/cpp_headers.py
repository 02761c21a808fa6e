"""Where fastpath's C++ host-dispatch headers are, so each generated package can carry a copy."""

from __future__ import annotations

from functools import cache
from pathlib import Path

# compiler/ and the headers are siblings in both layouts:
#   a checkout (editable install): <repo>/compiler and <repo>/cpp/include/fastpath
#   an installed wheel:            fastpath/compiler and fastpath/include/fastpath
_ROOT = Path(__file__).resolve().parent.parent
_CANDIDATES = (_ROOT / "cpp" / "include" / "fastpath", _ROOT / "include" / "fastpath")


@cache
def header_dir() -> Path:
    for candidate in _CANDIDATES:
        if any(candidate.glob("*.hpp")):
            return candidate
    raise FileNotFoundError(
        "fastpath's C++ headers are missing; looked in " + ", ".join(str(c) for c in _CANDIDATES)
    )


def headers() -> list[Path]:
    """The *.hpp files, in name order."""
    return sorted(header_dir().glob("*.hpp"))
