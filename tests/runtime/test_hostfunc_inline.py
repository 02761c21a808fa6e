"""Host callbacks without CUDA: every mode runs them inline, in order, with their arguments; kept
exceptions re-raise with their traceback; the module-level API; importing touches no CUDA."""

from __future__ import annotations

import subprocess
import sys
import traceback

import pytest
from hostdispatch_exts import load, mode_params

from fastpath.runtime.dispatch import dispatcher as hostfunc
from fastpath.runtime.dispatch.dispatcher import HostDispatcher


@pytest.fixture(autouse=True)
def fresh_default_dispatcher():
    hostfunc._default = None
    yield
    hostfunc._default = None


@pytest.mark.parametrize("case", mode_params())
def test_inline_runs_callbacks_in_order_with_their_arguments(case):
    name, mode = case
    d = HostDispatcher(mode, extension=load(name), device="cpu")
    seen = []
    for i in range(100):
        d.launch(lambda *a: seen.append(a), i, f"arg{i}", None)
    assert seen == [(i, f"arg{i}", None) for i in range(100)]
    info = d.info()
    assert (info["backend"], info["launched"], info["completed"]) == ("inline", 100, 100)
    assert info["device"] == "none"
    expected = "inline requested" if mode == "inline" else "no CUDA (CPU execution)"
    assert expected in d.reason


def _explode(value):
    raise ValueError(f"bad value {value}")


@pytest.mark.parametrize("case", mode_params())
def test_a_callback_exception_is_kept_and_reraised_with_its_traceback(case):
    name, mode = case
    d = HostDispatcher(mode, extension=load(name), device="cpu")
    ran = []
    d.launch(_explode, 7)
    d.launch(ran.append, "after")  # a failing callback does not stop the ones behind it
    assert ran == ["after"]
    with pytest.raises(ValueError, match="bad value 7") as info:
        d.check()
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "_explode" in frames and "check" in frames
    if sys.version_info >= (3, 11):
        assert "raised by host callback <function _explode" in info.value.__notes__[0]
    d.check()  # re-raised once, then gone


def test_several_exceptions_raise_the_oldest_and_name_the_rest():
    d = HostDispatcher("auto", device="cpu")
    for i in range(3):
        d.launch(_explode, i)
    with pytest.raises(ValueError, match="bad value 0") as info:
        d.check()
    if sys.version_info >= (3, 11):
        assert "2 more callback(s) raised since the last check" in info.value.__notes__[0]


def test_launch_rejects_what_is_not_callable():
    d = HostDispatcher("auto", device="cpu")
    with pytest.raises(TypeError, match="a host callback must be callable, not 42"):
        d.launch(42)


def test_after_shutdown_nothing_launches_and_the_report_says_all_ran():
    d = HostDispatcher("spin", device="cpu")
    d.launch(_explode, 1)
    report = d.shutdown(timeout=1.0)
    assert report.drained and report.not_run == () and report.graph_callbacks_not_run == 0
    assert [str(e) for e in report.errors] == ["bad value 1"]  # kept errors come back, not swallowed
    with pytest.raises(RuntimeError, match="shut down"):
        d.launch(print)


def test_shutdown_reports_a_callback_that_never_returns_instead_of_claiming_it_drained():
    import threading

    d = HostDispatcher("auto", device="cpu")
    entered, release = threading.Event(), threading.Event()

    def stuck() -> None:
        entered.set()
        release.wait(30)

    caller = threading.Thread(target=d.launch, args=(stuck,))
    caller.start()
    assert entered.wait(10)
    report = d.shutdown(timeout=0.2)
    assert not report.drained and report.still_running == 1 and report.waited_s >= 0.2
    release.set()
    caller.join(10)
    assert d.shutdown(timeout=0.2).drained, "once it returns, nothing is left running"


def test_token_ready_flag_marked_by_a_cpp_callback():
    d = HostDispatcher("auto", device="cpu")
    flag = d.token_ready_flag()
    assert not flag.wait(0, timeout=0.01)
    d.launch_token_ready(flag)
    d.launch_token_ready(flag)
    assert flag.ready_steps == 2 and flag.wait(1, timeout=0)
    d.launch_token_ready(flag, step=9)
    assert flag.ready_steps == 10 and not flag.wait(10, timeout=0.01)


def test_module_level_api_uses_one_default_dispatcher():
    d = hostfunc.set_dispatch("spin", device="cpu")
    assert hostfunc.default_dispatcher() is d
    seen = []
    hostfunc.launch_hostfunc(seen.append, 1)

    @hostfunc.hostfunc
    def record(a, b):
        seen.append((a, b))

    assert record(2, 3) is None
    assert record.__wrapped__ is not record and record.__name__ == "record"
    assert seen == [1, (2, 3)]
    info = hostfunc.dispatch_info()
    assert (info["mode"], info["backend"], info["extension"]) == (
        "spin",
        "inline",
        "fastpath.runtime._hostdispatch",
    )
    assert info["reason"] == "no CUDA (CPU execution): callbacks run inline, in order"
    hostfunc.launch_hostfunc(_explode, 3)
    with pytest.raises(ValueError, match="bad value 3"):
        hostfunc.check()


def test_check_without_a_default_dispatcher_does_nothing():
    hostfunc.check()
    assert hostfunc._default is None


def test_importing_hostfunc_loads_no_cuda_driver_and_no_torch():
    code = (
        "import sys, fastpath.runtime\n"
        "torch_before = 'torch' in sys.modules\n"
        "import fastpath.runtime.dispatch.dispatcher\n"
        "assert ('torch' in sys.modules) == torch_before, 'hostfunc imported torch'\n"
        "assert 'libcuda.so' not in open('/proc/self/maps').read(), 'driver loaded at import'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")
