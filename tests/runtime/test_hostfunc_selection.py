"""The spin chain: hostfunc_v2, then doorbell, then blocking. A fall back warns once per process,
or raises under on_unsupported="error" when only blocking is left; "auto" falls back silently.
Absence is simulated (a SimDevice that lacks a feature, or the simulate_absent test hook)."""

from __future__ import annotations

import warnings

import pytest
from hostdispatch_exts import extension_names, load, sim_extension

from fastpath.runtime.dispatch import dispatcher as hostfunc
from fastpath.runtime.dispatch.dispatcher import (
    HostDispatcher,
    HostDispatchFallbackWarning,
    HostDispatchUnsupportedError,
)

NATIVE = "fastpath.runtime._hostdispatch"
V2_ABSENT = "hostfunc_v2 unavailable: absent on the simulated device"
MEMOPS_ABSENT = "doorbell unavailable: absent on the simulated device"


@pytest.fixture(autouse=True)
def warn_again():
    hostfunc._reset_fallback_warning()
    yield
    hostfunc._reset_fallback_warning()


def caps(v2: bool, memops: bool, cuda: bool = True) -> dict:
    return {
        "cuda": cuda,
        "cuda_reason": "no CUDA driver",
        "hostfunc_v2": v2,
        "hostfunc_v2_reason": "needs 13.2",
        "memops": memops,
        "memops_reason": "no memops",
        "runtime_version": 13000,
        "driver_version": 13000,
    }


CHAIN = [
    # mode, v2, memops, backend, fallback warning (None: silent)
    ("spin", True, True, "hostfunc_v2", None),
    (
        "spin",
        False,
        True,
        "doorbell",
        "host dispatch 'spin': hostfunc_v2 unavailable: needs 13.2; using the doorbell backend",
    ),
    (
        "spin",
        False,
        False,
        "blocking",
        "host dispatch 'spin': hostfunc_v2 unavailable: needs 13.2; doorbell unavailable: no memops; "
        "falling back to blocking (cudaLaunchHostFunc)",
    ),
    ("auto", True, False, "hostfunc_v2", None),
    ("auto", False, True, "doorbell", None),
    ("auto", False, False, "blocking", None),
    ("blocking", True, True, "blocking", None),
    ("inline", True, True, "inline", None),
]


@pytest.mark.parametrize("mode, v2, memops, backend, fallback", CHAIN)
def test_the_spin_chain(mode, v2, memops, backend, fallback):
    chosen = load(NATIVE).select_backend(mode, "warn_once", caps(v2, memops))
    assert (chosen["backend"], chosen["fallback"]) == (backend, fallback)


def test_without_cuda_every_mode_runs_inline():
    for mode in ("blocking", "spin", "auto"):
        chosen = load(NATIVE).select_backend(mode, "error", caps(True, True, cuda=False))
        assert chosen == {
            "backend": "inline",
            "reason": "no CUDA (no CUDA driver): callbacks run inline, in order",
            "fallback": None,
        }


def test_on_unsupported_error_refuses_blocking_but_accepts_the_doorbell():
    ext = load(NATIVE)
    assert ext.select_backend("spin", "error", caps(False, True))["backend"] == "doorbell"
    with pytest.raises(ext.UnsupportedModeError) as info:
        ext.select_backend("spin", "error", caps(False, False))
    assert str(info.value) == (
        "host dispatch 'spin' is unsupported here (hostfunc_v2 unavailable: needs 13.2; doorbell unavailable: "
        "no memops) and on_unsupported=error forbids falling back to blocking"
    )
    assert ext.select_backend("auto", "error", caps(False, False))["backend"] == "blocking"


@pytest.mark.parametrize("name", extension_names(mode="spin"))
def test_a_fall_back_warns_exactly_once_per_process(name):
    ext = load(name)
    stream = sim_extension().SimStream()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = HostDispatcher(
            "spin", extension=ext, device=sim_extension().SimDevice(hostfunc_v2=False), stream=stream
        )
        second = HostDispatcher(
            "spin", extension=ext, device=sim_extension().SimDevice(hostfunc_v2=False), stream=stream
        )
        third = HostDispatcher(
            "spin",
            extension=ext,
            device=sim_extension().SimDevice(),
            stream=stream,
            simulate_absent=["hostfunc_v2"],
        )
    fallbacks = [w for w in caught if issubclass(w.category, HostDispatchFallbackWarning)]
    assert [str(w.message) for w in fallbacks] == [
        f"host dispatch 'spin': {V2_ABSENT}; using the doorbell backend"
    ]
    assert fallbacks[0].filename == __file__  # points at the caller
    assert (first.backend, second.backend, third.backend) == ("doorbell", "doorbell", "doorbell")
    assert third.fallback == (
        "host dispatch 'spin': hostfunc_v2 unavailable: simulated absent (test hook); using the doorbell backend"
    )
    stream.close()


@pytest.mark.parametrize("name", extension_names(mode="spin"))
def test_spin_without_either_spin_backend_falls_back_to_blocking_or_refuses(name):
    ext = load(name)
    device = sim_extension().SimDevice()
    if ext.FIXED_ON_UNSUPPORTED == "error":
        with pytest.raises(HostDispatchUnsupportedError, match="forbids falling back to blocking"):
            HostDispatcher(
                "spin", extension=ext, device=device, stream=1, simulate_absent=["hostfunc_v2", "memops"]
            )
        return
    with pytest.warns(HostDispatchFallbackWarning) as caught:
        d = HostDispatcher(
            "spin", extension=ext, device=device, stream=1, simulate_absent=["hostfunc_v2", "memops"]
        )
    assert d.backend == "blocking"
    assert str(caught[0].message) == (
        "host dispatch 'spin': hostfunc_v2 unavailable: simulated absent (test hook); "
        "doorbell unavailable: simulated absent (test hook); falling back to blocking (cudaLaunchHostFunc)"
    )


def test_auto_falls_back_silently():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = HostDispatcher(
            "auto", device=sim_extension().SimDevice(hostfunc_v2=False, memops=False), stream=1
        )
    assert d.backend == "blocking" and d.fallback is None
    assert d.reason == f"cudaLaunchHostFunc ({V2_ABSENT}; {MEMOPS_ABSENT})"


def test_spin_with_on_unsupported_error_raises_when_only_blocking_is_left():
    with pytest.raises(HostDispatchUnsupportedError, match="forbids falling back to blocking"):
        HostDispatcher(
            "spin", "error", device=sim_extension().SimDevice(hostfunc_v2=False, memops=False), stream=1
        )


def test_the_environment_can_simulate_absence(monkeypatch):
    monkeypatch.setenv(hostfunc.SIMULATE_ABSENT_ENV, "hostfunc_v2")
    with pytest.warns(HostDispatchFallbackWarning):
        d = HostDispatcher("spin", device=sim_extension().SimDevice(), stream=1)
    assert d.backend == "doorbell"
    assert d.info()["capabilities"]["hostfunc_v2"] == {
        "available": False,
        "reason": "simulated absent (test hook)",
    }
    d.shutdown(1.0)


def test_simulate_absent_names_only_what_it_knows():
    with pytest.raises(ValueError, match="simulate_absent takes 'hostfunc_v2' and 'memops', not 'cuda'"):
        HostDispatcher("spin", device="cpu", simulate_absent=["cuda"])


@pytest.mark.parametrize("name", extension_names())
def test_an_extension_says_whether_its_mode_is_fixed(name):
    ext = load(name)
    info = ext.build_info()
    assert info["fixed_mode"] == ext.FIXED_MODE
    assert set(ext.BACKENDS) <= {"inline", "blocking", "hostfunc_v2", "doorbell"} and "inline" in ext.BACKENDS
    if ext.FIXED_MODE is None:
        assert ext.MODES == ("inline", "blocking", "spin", "auto")
        assert ext.BACKENDS == ("inline", "blocking", "hostfunc_v2", "doorbell")
        return
    assert ext.MODES == (ext.FIXED_MODE,)
    other = "blocking" if ext.FIXED_MODE != "blocking" else "spin"
    with pytest.raises(ValueError, match=f"this extension is compiled for mode '{ext.FIXED_MODE}'"):
        ext.Engine(other, device="cpu")
    assert ext.Engine(device="cpu").mode == ext.FIXED_MODE


def test_bad_mode_names_are_refused():
    ext = load(NATIVE)
    with pytest.raises(ValueError, match="mode must be one of inline, blocking, spin, auto; not 'fast'"):
        ext.Engine("fast", device="cpu")
    with pytest.raises(ValueError, match="on_unsupported must be one of warn_once, error; not 'ignore'"):
        ext.Engine("spin", "ignore", device="cpu")
    with pytest.raises(ValueError, match="device must be 'cuda', 'cuda:N', 'cpu', None or a SimDevice"):
        ext.Engine("spin", device="tpu")

    class HandsOverNoCapsule:
        def __fastpath_device__(self):
            return object()

    with pytest.raises(TypeError, match="did not return a 'fastpath.hostdispatch.Device/abi-1' capsule"):
        ext.Engine("spin", device=HandsOverNoCapsule())
    with pytest.raises(ValueError, match="ring must be auto, queue, kernel, batched or memops, not 'bell'"):
        ext.Engine("spin", device="cpu", ring="bell")
    with pytest.raises(ValueError, match="queue_entries must be a power of two of at least 8, not 100"):
        ext.Engine("spin", device="cpu", queue_entries=100)


@pytest.mark.parametrize("ring", ["auto", "kernel"])
def test_a_device_that_only_writes_and_waits_says_which_ring_it_uses_and_why(ring):
    ext = load(NATIVE)
    device = sim_extension().SimDevice(hostfunc_v2=False, queue=False)
    d = HostDispatcher("spin", extension=ext, device=device, stream=sim_extension().SimStream(), ring=ring)
    info = d.info()
    assert (info["backend"], info["ring"], info["posts"], d.posts) == ("doorbell", "memops", False, False)
    assert info["ring_reason"] == f"this device rings with two memory operations ({ring} asked)"
    d.shutdown(1.0)


@pytest.mark.parametrize("ring", ["auto", "queue"])
def test_a_device_with_the_queue_ring_posts(ring):
    ext = load(NATIVE)
    d = HostDispatcher("spin", extension=ext, device=sim_extension().SimDevice(hostfunc_v2=False), stream=sim_extension().SimStream(),
                       ring=ring)  # fmt: skip
    assert (d.info()["ring"], d.posts) == ("queue", True)
    d.shutdown(1.0)


def test_backends_that_cannot_post_say_so():
    ext = load(NATIVE)
    for mode, device in (("blocking", sim_extension().SimDevice()), ("spin", sim_extension().SimDevice())):
        d = HostDispatcher(mode, extension=ext, device=device, stream=sim_extension().SimStream())
        assert d.backend in ("blocking", "hostfunc_v2") and not d.posts
        d.shutdown(1.0)
