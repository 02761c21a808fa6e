"""Which adapter each of the device's `max_loras` LoRA slots holds (model/lora_table.py).

A running sequence with an adapter holds a reference to its slot. A waiting one is admitted only
when its adapter is in a slot already, or a slot is free or held by no running sequence (the least
recently used of those is given up): at most `max_loras` adapters run in one batch, as in vLLM.
Loading a slot is queued here and done by the executor before the step that needs it, in stream
order, so a step still in flight has read the slot's old contents.

A sequence entering the engine pins its adapter's weights on the host (engine/adapter_store.py)
until it finishes, so loading a slot never reads a file.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from .adapter_store import AdapterStore, adapter_key
from .sequence import Sequence


class LoRASlots:
    def __init__(self, slots: int, store: AdapterStore) -> None:
        self.store = store
        self.ids: list[tuple[int, str] | None] = [None] * slots  # (lora_int_id, lora_path) of each slot
        self.refs = [0] * slots  # running sequences using it
        self._idle: OrderedDict[int, None] = OrderedDict()  # loaded, unreferenced; LRU first
        self.loads: list[tuple[int, Any]] = []  # (slot, LoRARequest) to load before the next step
        self._pinned: set[int] = set()  # ids of the sequences that pin their adapter in the store
        self.num_loads = 0
        self._namespaces: dict[tuple[int, str], int] = {}

    def enter(self, seq: Sequence) -> str | None:
        """A sequence entering the engine: its adapter's weights, read and checked now; why it
        cannot run (None: it can)."""
        if seq.lora is None or seq.seq_id in self._pinned:
            return None
        try:
            self.store.pin(seq.lora)
        except Exception as exc:
            return f"lora_request {seq.lora.lora_name!r}: {exc}"
        self._pinned.add(seq.seq_id)
        return None

    def leave(self, seq: Sequence) -> None:
        """A finished sequence: its slot and its pin go."""
        self.release(seq)
        if seq.seq_id in self._pinned:
            self._pinned.discard(seq.seq_id)
            self.store.unpin(seq.lora)

    def namespace(self, lora: Any) -> int:
        """A number of its own for each adapter this engine has seen (0: none): the prefix cache
        keys a sequence's blocks under it."""
        if lora is None:
            return 0
        return self._namespaces.setdefault(adapter_key(lora), len(self._namespaces) + 1)

    def _slot_of(self, key: tuple[int, str]) -> int | None:
        try:
            return self.ids.index(key)
        except ValueError:
            return None

    def can_take(self, seq: Sequence) -> bool:
        if seq.lora is None:
            return True
        return self._slot_of(adapter_key(seq.lora)) is not None or None in self.ids or bool(self._idle)

    def acquire(self, seq: Sequence) -> None:
        """Give `seq` its adapter's slot, loading the adapter into one if need be (can_take first)."""
        if seq.lora is None or seq.lora_slot >= 0:
            return
        key = adapter_key(seq.lora)
        slot = self._slot_of(key)
        if slot is None:
            if None in self.ids:
                slot = self.ids.index(None)
            else:
                slot, _ = self._idle.popitem(last=False)
            self.ids[slot] = key
            self.loads.append((slot, seq.lora))
            self.num_loads += 1
        self._idle.pop(slot, None)
        self.refs[slot] += 1
        seq.lora_slot = slot

    def release(self, seq: Sequence) -> None:
        slot = seq.lora_slot
        if slot < 0:
            return
        seq.lora_slot = -1
        self.refs[slot] -= 1
        if self.refs[slot] == 0:
            self._idle[slot] = None

    def take_loads(self) -> list[tuple[int, Any]]:
        loads, self.loads = self.loads, []
        return loads
