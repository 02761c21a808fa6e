"""A request's `lora_request`, checked where it enters: LoRA is on, the id names one folder only,
and the folder holds an adapter this model can run (model/lora_adapter.py reads its header, no
weights). A bad one fails its request alone, with a message naming the adapter."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from ..model.config import ModelConfig
from ..model.lora_adapter import AdapterError, read_header
from .lora_request import LoRARequest


class LoRAAdmission:
    def __init__(self, cfg: ModelConfig, max_loras: int, max_rank: int) -> None:
        self.cfg, self.max_loras, self.max_rank = cfg, max_loras, max_rank
        self._paths: dict[int, str] = {}  # lora_int_id -> the folder it was first admitted from
        self._lock = threading.Lock()

    def check(self, request: Any) -> LoRARequest | None:
        if request is None:
            return None
        if not isinstance(request, LoRARequest):
            raise TypeError(f"lora_request must be a LoRARequest, got {type(request).__name__}")
        if not self.max_loras:
            raise ValueError(
                f"lora_request {request.lora_name!r}: LoRA adapters are off; start the engine with "
                "LLM(..., enable_lora=True)"
            )
        with self._lock:
            known = self._paths.get(request.lora_int_id)
        if known is not None:
            if known != request.lora_path:
                raise ValueError(
                    f"lora_request {request.lora_name!r}: lora_int_id {request.lora_int_id} already names "
                    f"the adapter at {known!r}, not {request.lora_path!r}; give each adapter its own id"
                )
            return request
        try:
            read_header(request.lora_path, self.cfg, self.max_rank)
        except AdapterError as exc:
            raise AdapterError(f"lora_request {request.lora_name!r}: {exc}") from None
        with self._lock:
            self._paths.setdefault(request.lora_int_id, request.lora_path)
        return request

    def fresh_id(self) -> int:
        """An id no adapter has yet: a folder loaded again (its files perhaps changed) is a new adapter,
        whose weights are read afresh rather than taken from the store under its old id."""
        with self._lock:
            return max(self._paths, default=0) + 1

    def id_for(self, path: str) -> int:
        """The lora_int_id `path` was admitted under, else one no adapter has yet (the server's
        --lora-modules take theirs here, so they never collide with a caller's)."""
        path = os.path.abspath(os.path.expanduser(str(path)))  # as LoRARequest keeps it
        with self._lock:
            known = next((i for i, p in self._paths.items() if p == path), None)
            return known if known is not None else max(self._paths, default=0) + 1


def per_prompt(lora_request: Any, n: int) -> list[Any]:
    """vLLM's `lora_request`: one for every prompt, or a list with one per prompt."""
    if isinstance(lora_request, Sequence) and not isinstance(lora_request, (str, bytes)):
        if len(lora_request) != n:
            raise ValueError(f"lora_request has {len(lora_request)} entries for {n} prompts")
        return list(lora_request)
    return [lora_request] * n
