"""How the host learns that a step's sampled tokens have landed in pinned memory.

By default a C++ host callback (no GIL) marks a TokenReadyFlag when the stream passes the copy, and
the host waits on the flag with the GIL released. The forward never waits for the callback: it is
posted where the dispatcher posts (the doorbell's queue ring), else launched on a side stream. Under tensor parallelism rank 0 records a CUDA event instead, which it polls while
watching its workers (parallel/state.py).
"""

from __future__ import annotations

import torch

READBACK_TIMEOUT_S = 300.0  # a step that long is a hung device, not a slow one


class Readback:
    # Class switches, so bench/ab_decode.py can compare the three in one process.
    by_callback = True
    posting = True

    def __init__(self, dispatcher, device: torch.device, parallel) -> None:
        self.dispatcher = dispatcher
        self.device = device
        self.parallel = parallel
        self.is_cuda = device.type == "cuda"
        self._flag = dispatcher.token_ready_flag()
        self._posts = dispatcher.posts and self.posting
        self._stream = torch.cuda.Stream(device) if self.is_cuda and not self._posts else None
        self._tickets = 0

    def mark(self) -> tuple[int, torch.cuda.Event | None]:
        """After the device-to-host copies are enqueued: (ticket, event or None)."""
        ticket = self._tickets
        self._tickets += 1
        if self.is_cuda and (self.parallel is not None or not self.by_callback):
            event = torch.cuda.Event()
            event.record()
            return ticket, event
        if self._posts:
            self.dispatcher.launch_token_ready(self._flag, ticket, wait=False)
        elif self._stream is not None:
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._stream):
                self.dispatcher.launch_token_ready(self._flag, ticket)
        else:
            self.dispatcher.launch_token_ready(self._flag, ticket)
        return ticket, None

    def wait(self, ticket: int, event: torch.cuda.Event | None) -> None:
        if event is not None:
            if self.parallel is not None:
                self.parallel.wait(event)
            else:
                event.synchronize()
        elif not self._flag.wait(ticket, READBACK_TIMEOUT_S):
            raise RuntimeError(f"a step's tokens did not reach the host within {READBACK_TIMEOUT_S:.0f} s")
