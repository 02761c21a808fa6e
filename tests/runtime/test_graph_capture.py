"""Graph capture's guard on the CPU: no cyclic collection (and so no finalizer freeing a CUDA
resource) runs while a graph is captured, and the collector's state survives the capture."""

import gc

import pytest

from fastpath.runtime.runner.graphs import no_collection


class _Cycle:
    freed = 0

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        _Cycle.freed += 1


def test_no_garbage_is_collected_during_a_capture():
    assert gc.isenabled()
    gc.collect()
    _Cycle.freed = 0
    with no_collection():
        assert not gc.isenabled()
        for _ in range(2000):  # far past the collector's allocation threshold
            _Cycle()
        assert _Cycle.freed == 0
    assert gc.isenabled()
    gc.collect()
    assert _Cycle.freed == 2000


def test_a_failed_capture_turns_the_collector_back_on():
    with pytest.raises(RuntimeError, match="capture failed"), no_collection():
        raise RuntimeError("capture failed")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off():
    gc.disable()
    try:
        with no_collection():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
