"""Loaded by every process of a server started with PYTHONPATH=bench/phase_probe and
FASTPATH_PHASES_OUT=DIR (bench/device_run.sh serve-phases): the engine loop's phases are timed
(bench/phases.py), and each process that ran a step writes DIR/phases-PID.json as it exits. SIGUSR1
starts the totals over."""

import os

OUT = os.environ.get("FASTPATH_PHASES_OUT")
if OUT:
    import atexit
    import collections
    import json
    import signal
    import sys
    import time

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from phases import instrument

    spent: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()
    started = [time.perf_counter()]
    instrument(spent, calls)

    def _reset(signum, frame) -> None:
        """SIGUSR1 (bench/serve.py, as its timed run starts): start-up and warm-up leave the totals."""
        spent.clear()
        calls.clear()
        started[0] = time.perf_counter()

    signal.signal(signal.SIGUSR1, _reset)

    @atexit.register
    def _write() -> None:
        if calls:
            path = os.path.join(OUT, f"phases-{os.getpid()}.json")
            with open(path, "w") as f:
                payload = {"seconds": time.perf_counter() - started[0], "spent": spent, "calls": calls}
                json.dump(payload, f, indent=1)
