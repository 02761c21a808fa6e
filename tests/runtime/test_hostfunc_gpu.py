"""Host dispatch on a real GPU (run on the H200): for each mode, eager and inside a torch CUDA graph
replayed 1,000 times, exact callback counts and order, and each callback sees what the stream
wrote before it; doorbell slots reused; shutdown with pending work; hostfunc_v2 detected absent
on CUDA 13.0 with exactly one warning; the GIL regression; no leak of captured callbacks."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time
import warnings
import weakref

import pytest
import torch
from hostdispatch_exts import extension_names, load, mode_params

from fastpath.runtime.dispatch import dispatcher as hostfunc
from fastpath.runtime.dispatch.dispatcher import HostDispatcher, HostDispatchFallbackWarning

pytestmark = pytest.mark.gpu

SPIN_CAPABLE = ("blocking", "spin", "auto")


def wait_until(predicate, timeout=20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


@pytest.fixture(autouse=True)
def quiet_fallbacks():
    # Earlier tests' cycles (graphs, dispatchers) are collected now, while no callback waits for
    # the GIL: collected mid-replay, a graph's destructor syncs the device holding the GIL, which
    # a blocking callback queued before it needs (a hang seen once on the H200).
    gc.collect()
    torch.cuda.synchronize()
    hostfunc._reset_fallback_warning()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostDispatchFallbackWarning)
        yield
    hostfunc._reset_fallback_warning()


class Steps:
    """x counts steps on the GPU; each step copies it to pinned memory, then callbacks record it."""

    def __init__(self, ext, d: HostDispatcher):
        self.d = d
        self.x = torch.zeros(1, dtype=torch.int64, device="cuda")
        self.pinned = torch.zeros(1, dtype=torch.int64, pin_memory=True)
        self.log = ext.CallLog()
        self.seen: list[tuple[int, int, int]] = []

    def record(self, k: int) -> None:  # Python: the step, what the GPU had written, C++ calls before it
        self.seen.append((k, int(self.pinned[0]), len(self.log)))

    def step(self, k: int) -> None:
        self.x.add_(1)
        self.pinned.copy_(self.x, non_blocking=True)
        self.d.launch(self.record, k)
        self.d.engine.launch_log(self.d.stream_handle(), self.log, k)


@pytest.mark.parametrize("case", mode_params())
def test_eager_callbacks_keep_count_and_order_and_see_the_stream_before_them(case):
    name, mode = case
    ext = load(name)
    assert ext.build_info()["cuda"], "the GPU tests need the extension built with CUDA"
    d = HostDispatcher(mode, extension=ext, device="cuda")
    s = Steps(ext, d)
    for k in range(500):
        s.step(k)
    d.synchronize()
    assert s.seen == [(k, k + 1, k) for k in range(500)]
    assert s.log.tags() == list(range(500))
    info = d.info()
    assert (info["completed"], info["outstanding_eager"]) == (1000, 0)
    d.shutdown(5.0)


@pytest.mark.parametrize("case", mode_params(SPIN_CAPABLE))
def test_a_cuda_graph_replayed_1000_times_fires_every_callback_in_order(case):
    name, mode = case
    ext = load(name)
    d = HostDispatcher(mode, extension=ext, device="cuda")
    s = Steps(ext, d)
    g = torch.cuda.CUDAGraph()
    with d.graph(g) as captured:
        for k in range(3):
            s.step(k)
    assert captured.callbacks == 6 and s.seen == []
    for _ in range(1000):
        d.replay(g)
    d.synchronize()
    assert s.seen == [(k, 3 * r + k + 1, 3 * r + k) for r in range(1000) for k in range(3)]
    assert s.log.tags() == [0, 1, 2] * 1000
    info = d.info()
    assert (info["outstanding_graph"], info["unannounced"]) == (0, 0)
    del g
    d.shutdown(5.0)


@pytest.mark.parametrize("ring", ["memops", "batched", "kernel", "queue"])
@pytest.mark.parametrize("name", extension_names(mode="spin"))
def test_every_doorbell_ring_keeps_count_and_order_eagerly_and_over_1000_replays(name, ring):
    ext = load(name)
    d = HostDispatcher("spin", extension=ext, device="cuda", simulate_absent=["hostfunc_v2"], ring=ring)
    assert (d.backend, d.info()["ring"]) == ("doorbell", ring), d.info()["ring_reason"]
    s = Steps(ext, d)
    for k in range(200):
        s.step(k)
    d.synchronize()
    assert s.seen == [(k, k + 1, k) for k in range(200)]
    s.seen.clear()
    g = torch.cuda.CUDAGraph()
    with d.graph(g) as captured:
        for k in range(3):
            s.step(k)
    assert captured.callbacks == 6
    for _ in range(1000):
        d.replay(g)
    d.synchronize()
    assert s.seen == [(k, 200 + 3 * r + k + 1, 200 + 3 * r + k) for r in range(1000) for k in range(3)]
    assert s.log.tags() == list(range(200)) + [0, 1, 2] * 1000
    del g
    d.shutdown(5.0)


@pytest.mark.parametrize("name", extension_names(mode="spin"))
def test_posted_callbacks_keep_count_and_order_with_waiting_ones_eagerly_and_over_1000_replays(name):
    ext = load(name)
    d = HostDispatcher("spin", extension=ext, device="cuda", simulate_absent=["hostfunc_v2"], ring="queue")
    assert d.posts, d.info()["ring_reason"]
    x = torch.zeros(1, device="cuda")
    log, seen = ext.CallLog(), []

    def step(k: int) -> None:
        x.add_(1)
        d.launch(lambda k: seen.append((k, len(log))), k, wait=k % 2 == 0)
        d.engine.launch_log(d.stream_handle(), log, k, wait=k % 3 == 0)

    for k in range(300):
        step(k)
    d.synchronize()
    assert seen == [(k, k) for k in range(300)] and log.tags() == list(range(300))
    seen.clear()
    log.clear()
    g = torch.cuda.CUDAGraph()
    with d.graph(g) as captured:
        for k in range(4):
            step(k)
    assert captured.callbacks == 8
    for _ in range(1000):
        d.replay(g)
    d.synchronize()
    assert seen == [(k, 4 * r + k) for r in range(1000) for k in range(4)]
    assert log.tags() == [0, 1, 2, 3] * 1000
    assert (d.info()["outstanding_graph"], d.info()["unannounced"]) == (0, 0)
    del g
    d.shutdown(5.0)


@pytest.mark.parametrize("name", extension_names(mode="spin"))
def test_a_posted_callback_lets_the_gpu_stream_go_on(name):
    ext = load(name)
    d = HostDispatcher("spin", extension=ext, device="cuda", simulate_absent=["hostfunc_v2"], ring="queue")
    release, ran = threading.Event(), []
    x = torch.zeros(1, device="cuda")
    d.launch(lambda: (release.wait(10), ran.append(1)), wait=False)
    x.add_(1)
    stream = torch.cuda.current_stream()
    assert wait_until(stream.query, timeout=5.0)  # done on the GPU while its callback waits
    assert ran == []
    release.set()
    d.synchronize()
    assert ran == [1]
    d.shutdown(5.0)


def test_auto_ring_is_one_that_passed_its_self_test_here():
    d = HostDispatcher("spin", device="cuda", simulate_absent=["hostfunc_v2"])
    info = d.info()
    assert info["ring"] in ("queue", "kernel", "batched", "memops")
    reason = info["ring_reason"]
    assert f"{info['ring']} ring" in reason and reason.endswith("(self-test passed)"), reason
    d.shutdown(5.0)


@pytest.mark.parametrize("name", extension_names(mode="spin"))
def test_doorbell_slots_are_reused_across_graphs(name):
    ext = load(name)
    d = HostDispatcher("spin", extension=ext, device="cuda", max_slots=8, simulate_absent=["hostfunc_v2"])
    assert d.backend == "doorbell", d.reason
    x = torch.zeros(1, device="cuda")
    log = ext.CallLog()
    for i in range(40):  # 2 slots a graph, 8 slots: only reuse gets through
        g = torch.cuda.CUDAGraph()
        with d.graph(g):
            x.add_(1)
            d.engine.launch_log(d.stream_handle(), log, 2 * i)
            d.engine.launch_log(d.stream_handle(), log, 2 * i + 1)
        for _ in range(3):
            d.replay(g)
        d.synchronize()
        del g
        assert wait_until(lambda: (gc.collect(), d.info()["graph_slots"] == 0)[-1]), d.info()
    assert log.tags() == [t for i in range(40) for t in (2 * i, 2 * i + 1) * 3]
    assert d.info()["slots_in_use"] == 0
    d.shutdown(5.0)


@pytest.mark.parametrize("case", mode_params(SPIN_CAPABLE))
def test_shutdown_with_pending_work_returns_within_its_bound_and_reports(case):
    name, mode = case
    d = HostDispatcher(mode, extension=load(name), device="cuda")
    ran = []

    def pending_a():
        ran.append("a")

    def pending_b():
        ran.append("b")

    torch.cuda._sleep(2_000_000_000)  # about a second of GPU time ahead of the callbacks
    d.launch(pending_a)
    d.launch(pending_b)
    report = d.shutdown(timeout=0.2)
    assert report.waited_s < 5.0 and not report.drained
    assert [n.split(" at ")[0].rsplit(".", 1)[-1] for n in report.not_run] == ["pending_a", "pending_b"]
    finished = threading.Event()
    threading.Thread(target=lambda: (torch.cuda.synchronize(), finished.set()), daemon=True).start()
    assert finished.wait(60.0), "the stream was left waiting on a callback that will never run"
    assert ran == []


@pytest.mark.parametrize("name", extension_names(mode="spin"))
def test_hostfunc_v2_is_detected_by_version_and_a_fall_back_warns_once(name):
    ext = load(name)
    caps = ext.probe("cuda")
    new_enough = min(caps["runtime_version"], caps["driver_version"]) >= 13020
    hostfunc._reset_fallback_warning()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = HostDispatcher("spin", extension=ext, device="cuda")
        second = HostDispatcher("spin", extension=ext, device="cuda")
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, HostDispatchFallbackWarning)]
    if new_enough:
        assert caps["hostfunc_v2"]["available"], caps
        assert (first.backend, second.backend, fallbacks) == ("hostfunc_v2", "hostfunc_v2", [])
        return
    # CUDA 13.0 (the H200 here): absent, found out at run time; the doorbell spins instead.
    assert not caps["hostfunc_v2"]["available"]
    assert "needs CUDA runtime and driver 13.2 or newer" in caps["hostfunc_v2"]["reason"]
    assert caps["memops"] == {
        "available": True,
        "reason": "stream memory operations on mapped pinned memory (self-test passed)",
    }
    assert (first.backend, second.backend) == ("doorbell", "doorbell")
    assert len(fallbacks) == 1 and fallbacks[0].startswith(
        "host dispatch 'spin': hostfunc_v2 unavailable: needs"
    )


GIL_SCRIPT = """
import sys, torch
from fastpath.runtime.dispatch.dispatcher import HostDispatcher
d = HostDispatcher(sys.argv[1], extension=sys.argv[2], device="cuda")
torch.cuda._sleep(500_000_000)
seen = []
for i in range(20000):
    d.launch(seen.append, i)
d.synchronize()
assert seen == list(range(20000))
print("no deadlock")
"""


@pytest.mark.parametrize("case", mode_params(SPIN_CAPABLE))
def test_launches_do_not_deadlock_against_callbacks_waiting_for_the_gil(case):
    name, mode = case
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", GIL_SCRIPT, mode, name],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "no deadlock"


class Callable:
    def __call__(self) -> None:
        pass


@pytest.mark.parametrize("case", mode_params(SPIN_CAPABLE))
def test_captured_callbacks_die_with_their_graphs(case):
    name, mode = case
    ext = load(name)
    d = HostDispatcher(mode, extension=ext, device="cuda")
    x = torch.zeros(1, device="cuda")
    baseline = ext.live_callbacks()
    refs = []
    for _ in range(20):
        fn = Callable()
        refs.append(weakref.ref(fn))
        g = torch.cuda.CUDAGraph()
        with d.graph(g):
            x.add_(1)
            d.launch(fn)
        del fn
        d.replay(g)
        d.synchronize()
        assert refs[-1]() is not None  # alive while its graph is
        del g
    torch.cuda.synchronize()
    assert wait_until(lambda: (gc.collect(), ext.reap(), all(r() is None for r in refs))[-1])
    assert wait_until(lambda: ext.live_callbacks() == baseline)
    assert d.info()["graph_callbacks_alive"] == 0
    d.shutdown(5.0)


@pytest.mark.parametrize("name", extension_names(mode="spin"))
def test_a_pinned_tensor_a_dead_graph_released_is_not_freed_into_the_next_capture(name):
    # torch records an event on every stream a pinned block was used on when the block is freed;
    # recorded into a capture, that event fails the next pinned allocation ("invalid argument").
    ext = load(name)
    d = HostDispatcher("spin", extension=ext, device="cuda", simulate_absent=["hostfunc_v2"])
    x = torch.zeros(1, dtype=torch.int64, device="cuda")
    pinned = torch.zeros(1, dtype=torch.int64, pin_memory=True)
    g = torch.cuda.CUDAGraph()
    with d.graph(g):
        x.add_(1)
        pinned.copy_(x, non_blocking=True)
        d.launch(lambda p=pinned: None)  # the graph's callback holds the last reference
    del pinned
    d.replay(g)
    d.synchronize()
    del g  # the doorbell worker drops the callback without the GIL
    assert wait_until(lambda: ext.graveyard_size() > 0)
    g2 = torch.cuda.CUDAGraph()
    with d.graph(g2):
        x.add_(1)
        d.launch(lambda: None)
    d.replay(g2)
    d.synchronize()
    torch.zeros(1, dtype=torch.int64, pin_memory=True)  # reuses the freed block's size class
    del g2
    d.shutdown(5.0)


@pytest.mark.parametrize("case", mode_params(SPIN_CAPABLE))
def test_a_token_flag_marked_from_a_graph_releases_a_streaming_thread(case):
    name, mode = case
    d = HostDispatcher(mode, extension=load(name), device="cuda")
    x = torch.zeros(1, device="cuda")
    flag = d.token_ready_flag()
    g = torch.cuda.CUDAGraph()
    with d.graph(g):
        x.add_(1)
        d.launch_token_ready(flag)
    got = []
    waiter = threading.Thread(target=lambda: got.append(flag.wait(99, timeout=30.0)))
    waiter.start()
    for _ in range(100):
        d.replay(g)
    waiter.join(timeout=60.0)
    assert got == [True] and flag.ready_steps == 100
    d.synchronize()
    del g
    d.shutdown(5.0)
