"""LoRA adapters' weights on the host, read and checked when a request that needs one enters the
engine (model/lora_adapter.py), so that a bad or vanished adapter fails its requests there, alone,
and loading a device slot later never reads a file.

An adapter's weights stay while any sequence that runs it is unfinished (pinned), and up to
`capacity` more are kept, least recently used first out (vLLM's max_cpu_loras).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

Weights = dict  # (layer, HF module) -> (A, scaled B), on the CPU


def adapter_key(lora: Any) -> tuple[int, str]:
    """An adapter is its id and its folder together: clients of one engine process check their ids
    apart (engine/lora_admission.py), so two may give one id to different folders."""
    return (lora.lora_int_id, lora.lora_path)


class AdapterStore:
    def __init__(self, read: Callable[[Any], Weights], capacity: int) -> None:
        self._read = read
        self.capacity = capacity
        self._weights: OrderedDict[tuple[int, str], Weights] = OrderedDict()
        self._pins: dict[tuple[int, str], int] = {}
        self.num_reads = 0

    def pin(self, lora: Any) -> None:
        """Hold `lora`'s weights, reading them if they are not here; raises what reading raised."""
        key = adapter_key(lora)
        if key not in self._weights:
            self._weights[key] = self._read(lora)
            self.num_reads += 1
        self._weights.move_to_end(key)
        self._pins[key] = self._pins.get(key, 0) + 1
        self._trim()

    def unpin(self, lora: Any) -> None:
        key = adapter_key(lora)
        self._pins[key] -= 1
        if not self._pins[key]:
            del self._pins[key]
        self._trim()

    def weights(self, lora: Any) -> Weights:
        return self._weights[adapter_key(lora)]

    def _trim(self) -> None:
        idle = [k for k in self._weights if k not in self._pins]  # least recently used first
        for key in idle[: max(0, len(self._weights) - self.capacity)]:
            del self._weights[key]
