"""The GIL's switch interval in the processes fastpath owns: the engine process and the server's.

A thread that wants the GIL waits up to the switch interval (CPython's default is 5 ms) before it
asks the thread that holds it to let go. Every request and every step's tokens cross threads on the
way through a server: the API process's event loop, its pipe reader and sender, the engine process's
pipe reader, loop and senders. While the event loop is busy, each crossing waited for the interval. On
two cores, with a 1.5 ms stub step, the mean time from a request's arrival to its first batch slot
went from 8.8–10.7 ms to 5.0–5.5 ms at 0.5 ms. On the H200 (round 13, `bash bench/device_run.sh
serve-gil`), 0.1 ms took the server from 86.3% to 90.4% of offline `generate` at concurrency 64, and
its decode steps from 1.61 to 1.55 ms: the engine's loop lost nothing to the shorter slices and the
threads that feed it waited less. `bench/serve.py --server-env FASTPATH_GIL_SWITCH_US=...` measures
another interval beside this one (0: CPython's own).

An engine in the caller's process (`LLM`) leaves the caller's interval alone: it is the caller's
setting. Round 11 tried shortening it there too. With 64 caller threads each streaming its own
request, the one run with it took 4.17 ms per decode step; two runs without it took 4.22 and 4.85 ms.
One run cannot tell that apart from the spread, so it was not adopted.

`FASTPATH_GIL_SWITCH_US` overrides the interval; 0 leaves CPython's own.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("fastpath.engine")

SWITCH_INTERVAL_S = 0.0001
ENV = "FASTPATH_GIL_SWITCH_US"


def prompt_handoffs() -> float:
    """Shorten this process's switch interval (never lengthen it); the interval now, in seconds."""
    wanted = SWITCH_INTERVAL_S
    raw = os.environ.get(ENV)
    if raw is not None:
        try:
            wanted = float(raw) * 1e-6
        except ValueError:
            log.warning(
                "%s=%r is not a number of microseconds; using %.0f", ENV, raw, SWITCH_INTERVAL_S * 1e6
            )
        if wanted < 0:
            log.warning("%s=%r is negative; using %.0f", ENV, raw, SWITCH_INTERVAL_S * 1e6)
            wanted = SWITCH_INTERVAL_S
    if wanted > 0 and wanted < sys.getswitchinterval():
        sys.setswitchinterval(wanted)
    return sys.getswitchinterval()
