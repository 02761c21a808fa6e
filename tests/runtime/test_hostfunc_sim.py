"""Every backend's real protocol on the simulated device (a CPU thread per stream): exact counts
and order, eager and in graphs replayed 1,000 times; doorbell slots reused and exhausted;
captured callbacks living as long as their graph; bounded shutdown; the idle worker sleeping."""

from __future__ import annotations

import gc
import sys
import threading
import time
import traceback
import warnings
import weakref
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest
from hostdispatch_exts import extension_names, load, sim_extension, sim_params

from fastpath.runtime.dispatch.dispatcher import (
    HostDispatcher,
    HostDispatchFallbackWarning,
    HostDispatchWarning,
)


@dataclass
class Sim:
    ext: ModuleType
    d: HostDispatcher
    stream: Any
    backend: str

    def log_tag(self, log: Any, tag: int, wait: bool = True) -> None:
        self.d.engine.launch_log(self.stream.handle, log, tag, wait)

    def capture(self, body) -> Any:
        self.stream.begin_capture()
        try:
            with self.d.capture(stream=self.stream) as record:
                body()
        finally:
            graph = self.stream.end_capture()
        self.d.register_graph(graph, record.callbacks)
        return graph


def make_sim(name: str, mode: str, device: dict, **options: Any) -> Sim:
    ext = load(name)
    stream = sim_extension().SimStream()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostDispatchFallbackWarning)
        d = HostDispatcher(
            mode, extension=ext, device=sim_extension().SimDevice(**device), stream=stream, **options
        )
    return Sim(ext, d, stream, d.backend)


@pytest.fixture(autouse=True)
def quick_gil_handoff():
    # The worker takes the GIL from a main thread that is busy launching: hand it over sooner.
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    yield
    sys.setswitchinterval(before)


@pytest.fixture(params=sim_params())
def sim(request):
    name, mode, device, backend = request.param
    s = make_sim(name, mode, device, safety_poll_us=1000)
    assert s.backend == backend
    yield s
    s.d.shutdown(5.0)
    s.stream.close()


def wait_until(predicate, timeout=10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def test_eager_callbacks_run_once_each_in_stream_order(sim):
    log, seen = sim.ext.CallLog(), []
    for i in range(300):  # Python, then C++, on one stream; posted and waiting mixed
        sim.d.launch(lambda i: seen.append((i, len(log))), i, wait=i % 2 == 0)
        sim.log_tag(log, i, wait=i % 3 != 0)
    sim.d.synchronize()  # waits for posted callbacks too
    assert seen == [(i, i) for i in range(300)]
    assert log.tags() == list(range(300))
    info = sim.d.info()
    assert (info["launched"], info["completed"], info["outstanding_eager"]) == (600, 600, 0)


def test_a_graph_replayed_1000_times_fires_each_callback_once_per_replay_in_order(sim):
    log, seen = sim.ext.CallLog(), []

    def body():
        for k in range(3):
            sim.d.launch(lambda k: seen.append((k, len(log))), k, wait=k != 1)
            sim.log_tag(log, k, wait=k != 2)

    graph = sim.capture(body)
    assert seen == [] and len(log) == 0  # captured, not run
    for _ in range(1000):
        sim.d.replay(graph, sim.stream)
    sim.d.synchronize()
    assert seen == [(k, 3 * r + k) for r in range(1000) for k in range(3)]
    assert log.tags() == [0, 1, 2] * 1000
    info = sim.d.info()
    assert (info["completed"], info["outstanding_graph"], info["unannounced"]) == (6000, 0, 0)


def test_streams_keep_their_own_order(sim):
    other = sim_extension().SimStream()
    seen = {0: [], 1: []}
    for i in range(200):
        sim.d.launch_on(sim.stream, seen[0].append, i)
        sim.d.launch_on(other, seen[1].append, i)
    sim.d.synchronize(other)
    sim.d.synchronize()
    assert seen == {0: list(range(200)), 1: list(range(200))}
    other.close()


def _explode(value):
    raise ValueError(f"bad value {value}")


def test_an_exception_on_the_dispatch_thread_reaches_synchronize_with_its_traceback(sim):
    ran = []
    sim.d.launch(_explode, 5)
    sim.d.launch(ran.append, 1)
    with pytest.raises(ValueError, match="bad value 5") as info:
        sim.d.synchronize()
    assert "_explode" in [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert ran == [1]


def test_python_callbacks_run_on_one_persistent_thread_state(sim):
    local, counts = threading.local(), []

    def count() -> None:  # threading.local lives in the thread state: a new state per call resets it
        local.calls = getattr(local, "calls", 0) + 1
        counts.append(local.calls)

    for _ in range(20):
        sim.d.launch(count)
    sim.d.synchronize()
    assert counts == list(range(1, 21))


def test_no_cyclic_collection_runs_inside_a_callback(sim):
    """A cycle collected there could free a CUDA graph on the driver's host-task thread (an abort)."""
    enabled, callback_threads, collected_on = [], set(), []

    class Cycle:
        def __del__(self) -> None:
            collected_on.append(threading.get_ident())

    def garbage_then_allocate() -> None:
        enabled.append(gc.isenabled())
        callback_threads.add(threading.get_ident())
        cycle = Cycle()
        cycle.me = cycle
        del cycle
        [[] for _ in range(20 * gc.get_threshold()[0])]  # far past the collector's threshold

    gc.collect()
    for _ in range(5):
        sim.d.launch(garbage_then_allocate)
    sim.d.synchronize()
    assert threading.get_ident() not in callback_threads, "callbacks run off the launching thread"
    assert enabled == [False] * 5 and gc.isenabled(), "off inside every callback, back on after"
    gc.collect()
    assert len(collected_on) == 5 and not callback_threads & set(collected_on)


class Callable:
    def __call__(self) -> None:
        pass


def test_captured_callbacks_live_as_long_as_their_graph_and_do_not_leak(sim):
    baseline = sim.ext.live_callbacks()
    refs = []
    for _ in range(50):
        fn = Callable()
        refs.append(weakref.ref(fn))
        graph = sim.capture(lambda fn=fn: sim.d.launch(fn))
        del fn
        assert refs[-1]() is not None  # the graph holds it
        sim.d.replay(graph, sim.stream)
        sim.d.synchronize()
        graph.reset()  # destroying the graph releases what it captured
    assert wait_until(lambda: (sim.ext.reap(), gc.collect(), all(r() is None for r in refs))[-1])
    assert wait_until(lambda: sim.ext.live_callbacks() == baseline)
    assert sim.d.info()["graph_callbacks_alive"] == 0


def test_shutdown_with_pending_work_is_bounded_and_reports_what_did_not_run(sim):
    ran = []

    def first_callback():
        ran.append(1)

    def second_callback():
        ran.append(2)

    sim.stream.busy(0.5)  # a long kernel ahead of the callbacks
    sim.d.launch(first_callback)
    sim.d.launch(second_callback)
    report = sim.d.shutdown(timeout=0.05)
    assert report.waited_s < 5.0
    assert not report.drained
    assert [name.split(" at ")[0] for name in report.not_run] == [
        "<function test_shutdown_with_pending_work_is_bounded_and_reports_what_did_not_run.<locals>.first_callback",
        "<function test_shutdown_with_pending_work_is_bounded_and_reports_what_did_not_run.<locals>.second_callback",
    ]
    assert sim.stream.synchronize(timeout=10.0)  # answered, not run: the stream is not left hanging
    assert ran == []
    assert wait_until(lambda: sim.d.info()["discarded"] == 2)


def test_shutdown_drains_pending_work_within_the_bound(sim):
    ran = []
    sim.stream.busy(0.05)
    for i in range(5):
        sim.d.launch(ran.append, i)
    report = sim.d.shutdown(timeout=10.0)
    assert report.drained and report.not_run == ()
    assert ran == list(range(5))


def test_graph_callbacks_announced_but_not_run_are_reported(sim):
    graph = sim.capture(lambda: sim.d.launch(print))
    sim.stream.busy(0.5)
    sim.d.replay(graph, sim.stream)
    report = sim.d.shutdown(timeout=0.05)
    assert (report.drained, report.graph_callbacks_not_run, report.graph_callbacks_alive) == (False, 1, 1)
    assert sim.stream.synchronize(timeout=10.0)


def test_a_token_flag_marked_from_a_graph_wakes_a_waiting_thread(sim):
    flag = sim.ext.TokenReadyFlag()
    graph = sim.capture(lambda: sim.d.launch_token_ready(flag, stream=sim.stream))
    got = []
    waiter = threading.Thread(target=lambda: got.append(flag.wait(19, timeout=10.0)))
    waiter.start()
    for _ in range(20):
        sim.d.replay(graph, sim.stream)
    waiter.join(timeout=15.0)
    assert got == [True] and flag.ready_steps == 20


def test_a_dropped_dispatcher_keeps_serving_the_graphs_captured_through_it(sim):
    seen = []
    graph = sim.capture(lambda: sim.d.launch(seen.append, "fired"))
    stream, ext = sim.stream, sim.ext
    sim.d = None  # the fixture's dispatcher is gone; the engine detaches
    gc.collect()
    graph.replay(stream)  # unannounced: the worker finds it by polling
    assert stream.synchronize(timeout=10.0)
    assert seen == ["fired"]
    graph.reset()
    sim.d = HostDispatcher(extension=ext, device="cpu")  # for the fixture's teardown


DOORBELL = sim_params(backends=("doorbell",))


@pytest.mark.parametrize("case", DOORBELL)
def test_doorbell_slots_are_reused_as_graphs_come_and_go(case):
    name, mode, device, _ = case
    s = make_sim(name, mode, device, max_slots=8)
    log = s.ext.CallLog()
    for i in range(200):
        graph = s.capture(lambda i=i: (s.log_tag(log, 2 * i), s.log_tag(log, 2 * i + 1)))
        for _ in range(3):
            s.d.replay(graph, s.stream)
        s.d.synchronize()
        graph.reset()
        assert wait_until(lambda: s.d.info()["graph_slots"] == 0)
    assert log.tags() == [t for i in range(200) for t in (2 * i, 2 * i + 1) * 3]
    info = s.d.info()
    assert (info["slots_in_use"], info["slot_limit"], info["stream_slots"]) == (0, 8, 0)
    s.d.shutdown(5.0)
    s.stream.close()


POSTING = [p for p in DOORBELL if p.values[0][2].get("queue", True)]  # the queue ring
NOT_POSTING = [p for p in DOORBELL if not p.values[0][2].get("queue", True)]


@pytest.mark.parametrize("case", POSTING)
def test_a_posted_callback_lets_its_stream_go_on_and_synchronize_waits_for_it(case):
    s = make_sim(*case[:3])
    assert s.d.posts
    release, ran = threading.Event(), []
    s.d.launch(lambda: (release.wait(10), ran.append("posted")), wait=False)
    s.stream.busy(0.0)
    assert s.stream.synchronize(timeout=5.0)  # the stream is done; its callback still waits
    assert ran == []
    release.set()
    s.d.synchronize()
    assert ran == ["posted"]
    s.d.shutdown(5.0)
    s.stream.close()


@pytest.mark.parametrize("case", NOT_POSTING)
def test_a_ring_that_cannot_post_makes_a_posted_callback_wait(case):
    s = make_sim(*case[:3])
    assert not s.d.posts
    release, ran = threading.Event(), []
    s.d.launch(lambda: (release.wait(10), ran.append("posted")), wait=False)
    assert not s.stream.synchronize(timeout=0.3)  # the stream waits for it
    release.set()
    s.d.synchronize()
    assert ran == ["posted"]
    s.d.shutdown(5.0)
    s.stream.close()


@pytest.mark.parametrize("case", POSTING)
def test_a_full_queue_holds_its_stream_until_the_worker_catches_up(case):
    s = make_sim(*case[:3], queue_entries=8)
    release, seen = threading.Event(), []
    s.d.launch(release.wait, 10, wait=False)  # holds the worker on the first entry
    for i in range(100):
        s.d.launch(seen.append, i, wait=False)
    assert not s.stream.synchronize(timeout=0.3)  # eight entries claimed, then the stream stops
    assert seen == []
    release.set()
    s.d.synchronize()
    assert seen == list(range(100))
    s.d.shutdown(5.0)
    s.stream.close()


@pytest.mark.parametrize("case", POSTING)
def test_a_graph_posting_through_a_small_queue_keeps_count_and_order_lap_after_lap(case):
    s = make_sim(*case[:3], queue_entries=8)
    log = s.ext.CallLog()
    graph = s.capture(lambda: [s.log_tag(log, k, wait=k == 5) for k in range(6)])
    for _ in range(500):  # 3000 entries: 375 laps of the queue
        s.d.replay(graph, s.stream)
    s.d.synchronize()
    assert log.tags() == list(range(6)) * 500
    assert s.d.info()["outstanding_graph"] == 0
    graph.reset()
    s.d.shutdown(5.0)
    s.stream.close()


@pytest.mark.parametrize("case", POSTING)
def test_a_released_graph_keeps_its_slot_until_entries_behind_an_unwritten_claim_are_served(case):
    s = make_sim(*case[:3])
    slow, other = sim_extension().SimStream(), sim_extension().SimStream()
    slow.delay_queue_stores(0.3)  # claims at once, writes its entry 0.3 s later: a gap
    ran = []
    s.d.launch_on(slow, ran.append, "slow", wait=False)
    time.sleep(0.05)
    graph = s.capture(lambda: s.d.launch(ran.append, "graph", wait=False))
    s.d.replay(graph, s.stream)
    assert s.stream.synchronize(timeout=5.0)
    graph.reset()  # its entry is written, but behind the gap
    time.sleep(0.05)
    s.d.launch_on(other, ran.append, "other")  # a new stream: it must not get the graph's slot
    assert other.synchronize(timeout=5.0) and slow.synchronize(timeout=5.0)
    s.d.synchronize()
    assert ran == ["slow", "graph", "other"]
    assert wait_until(lambda: s.d.info()["graph_slots"] == 0)
    s.d.shutdown(5.0)
    for stream in (s.stream, slow, other):
        stream.close()


@pytest.mark.parametrize("case", POSTING)
def test_shutdown_reports_posted_callbacks_that_will_not_run(case):
    s = make_sim(*case[:3])
    release, ran = threading.Event(), []
    s.d.launch(release.wait, 10, wait=False)
    for i in range(5):
        s.d.launch(ran.append, i, wait=False)
    assert s.stream.synchronize(timeout=5.0)
    report = s.d.shutdown(timeout=0.1)
    assert not report.drained and len(report.not_run) == 5
    release.set()
    assert wait_until(lambda: s.d.info()["discarded"] == 5)
    assert ran == []
    s.stream.close()


@pytest.mark.parametrize("case", DOORBELL)
def test_references_dropped_off_the_gil_are_not_freed_while_a_capture_is_underway(case):
    # Freeing a callback can free CUDA resources: on the H200 a torch pinned tensor freed during a
    # capture recorded a captured event, and the next pinned allocation failed.
    name, mode, device, _ = case
    s = make_sim(name, mode, device)
    fn = Callable()
    ref = weakref.ref(fn)
    graph = s.capture(lambda fn=fn: s.d.launch(fn))
    del fn
    s.d.replay(graph, s.stream)
    s.d.synchronize()
    graph.reset()  # the worker frees the graph's slot without the GIL: fn waits in the graveyard
    assert wait_until(lambda: s.ext.graveyard_size() > 0)
    alive_in_capture = []

    def body() -> None:
        s.d.launch(lambda: None)
        s.d.info()
        s.d.check()
        s.ext.reap()
        alive_in_capture.append(ref() is not None)

    s.d.engine.take_capture(2**40)  # a capture never counted resumes nothing
    inner = s.capture(body)
    assert alive_in_capture == [True]
    s.d.launch(lambda: None)  # outside a capture, a launch reaps
    assert ref() is None and s.ext.graveyard_size() == 0
    s.d.synchronize()
    inner.reset()
    s.d.shutdown(5.0)
    s.stream.close()


@pytest.mark.parametrize("case", DOORBELL)
def test_running_out_of_doorbell_slots_says_how_many_are_in_use_and_the_limit(case):
    name, mode, device, _ = case
    s = make_sim(name, mode, device, max_slots=4)
    s.d.launch(lambda: None)  # takes the stream's own slot
    s.d.synchronize()
    graph = s.capture(lambda: [s.d.launch(lambda: None) for _ in range(3)])
    s.stream.begin_capture()
    with pytest.raises(RuntimeError) as info:
        s.d.launch(lambda: None)
    s.stream.end_capture()
    assert str(info.value) == (
        "doorbell host dispatch has no free flag slot: 4 of 4 in use (1 by streams, 3 by callbacks in live "
        "CUDA graphs); destroy graphs that are no longer needed or raise max_slots"
    )
    graph.reset()
    assert wait_until(lambda: s.d.info()["slots_in_use"] == 1)
    s.d.shutdown(5.0)
    s.stream.close()


@pytest.mark.parametrize("case", DOORBELL)
def test_the_idle_doorbell_worker_sleeps_and_wakes_for_work(case):
    name, mode, device, _ = case
    s = make_sim(name, mode, device)
    s.d.launch(lambda: None)
    s.d.synchronize()
    assert wait_until(lambda: s.d.info()["worker_state"] == "sleeping")
    before = s.d.info()["worker_wakeups"]
    time.sleep(0.3)
    after = s.d.info()
    assert after["worker_state"] == "sleeping" and after["worker_wakeups"] == before  # no polling
    seen = []
    s.d.launch(seen.append, 1)
    s.d.synchronize()
    assert seen == [1]
    s.d.shutdown(5.0)
    s.stream.close()


@pytest.mark.parametrize("case", DOORBELL)
def test_an_announcement_nothing_answers_ends_in_backoff_not_a_busy_core(case):
    name, mode, device, _ = case
    s = make_sim(name, mode, device, spin_budget_us=2000)
    s.d.announce(3)  # a replay that never happens
    assert wait_until(lambda: s.d.info()["worker_state"] == "backoff")
    s.d.announce(-3)
    assert wait_until(lambda: s.d.info()["worker_state"] == "sleeping")
    s.d.shutdown(5.0)
    s.stream.close()


@pytest.mark.parametrize("case", DOORBELL)
def test_an_unannounced_replay_still_runs_and_warns_once(case):
    name, mode, device, _ = case
    s = make_sim(name, mode, device, safety_poll_us=1000)
    seen = []
    graph = s.capture(lambda: s.d.launch(seen.append, 1))
    graph.replay(s.stream)  # not through s.d.replay: nobody announced it
    assert s.stream.synchronize(timeout=10.0)
    with pytest.warns(
        HostDispatchWarning, match="1 graph host callback\\(s\\) fired with no replay announced"
    ):
        s.d.check()
    graph.replay(s.stream)
    assert s.stream.synchronize(timeout=10.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.d.check()  # once
    assert seen == [1, 1]
    s.d.shutdown(5.0)
    s.stream.close()


@pytest.mark.parametrize("name", extension_names(mode="inline"))
def test_inline_mode_refuses_to_be_captured(name):
    ext = load(name)
    stream = sim_extension().SimStream()
    d = HostDispatcher("inline", extension=ext, device=sim_extension().SimDevice(), stream=stream)
    stream.begin_capture()
    with pytest.raises(RuntimeError, match="inline host dispatch cannot be captured into a CUDA graph"):
        d.launch(print)
    stream.end_capture()
    stream.close()
