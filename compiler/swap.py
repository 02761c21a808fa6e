"""Two file-system primitives for whole-package writes: a lock on the output folder, and a folder swap."""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

try:
    import fcntl
except ImportError:  # not a POSIX system: runs are not serialised there
    fcntl = None

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


@contextmanager
def output_lock(out: Path, *, shared: bool = False) -> Iterator[None]:
    """flock() on the output folder itself: writers exclusive, readers (--check) shared."""
    if fcntl is None or not out.is_dir():
        yield
        return
    fd = os.open(out, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@cache
def _renameat2():
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return function


def exchange(new: Path, current: Path, *, old: Path) -> None:
    """Swap the folders `new` and `current`: afterwards `current` holds the new tree and `new` the old.

    Linux swaps them in one step (renameat2 RENAME_EXCHANGE). Elsewhere it takes three renames
    through `old`; a run killed in between leaves `old` for clean_leftovers() to put back or drop.
    """
    renameat2 = _renameat2()
    if renameat2 is not None:
        if renameat2(_AT_FDCWD, os.fsencode(new), _AT_FDCWD, os.fsencode(current), _RENAME_EXCHANGE) == 0:
            return
        if ctypes.get_errno() not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            code = ctypes.get_errno()
            raise OSError(code, f"cannot swap {new} into {current}: {os.strerror(code)}")
    os.rename(current, old)
    os.rename(new, current)
    os.rename(old, new)
