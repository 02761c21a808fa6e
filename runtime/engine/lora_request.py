"""vLLM's `LoRARequest`: which adapter a request runs with.

An adapter is named by `lora_int_id` (positive, unique per adapter: the engine keys its slots and
the prefix cache by it) and read from `lora_path`, a PEFT folder (adapter_config.json and
adapter_model.safetensors; model/lora_adapter.py). The path is made absolute where the request is
made, so an engine in another process (or after a chdir) reads the same folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .sampling_params import doc


@dataclass(frozen=True, slots=True)
class LoRARequest:
    """vLLM's: the adapter a request runs with (`generate(..., lora_request=...)`; the engine needs
    `enable_lora=True`). An adapter is read from its PEFT folder when a device slot takes it; one
    the model cannot run (a rank above max_lora_rank, modules besides the decoder's seven
    projections, DoRA) fails its request, naming what it holds."""

    lora_name: str = field(metadata=doc("A name for logs and errors (the server's model name)."))
    lora_int_id: int = field(
        metadata=doc("Identifies the adapter, in [1, 2**31): one id, one folder, for the engine's life.")
    )
    lora_path: str = field(
        default="", metadata=doc("The PEFT folder: adapter_config.json and adapter_model.safetensors.")
    )
    base_model_name: str | None = field(default=None, metadata=doc("vLLM's; not used."))

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"LoRARequest.lora_name must be a non-empty string, got {self.lora_name!r}")
        i = self.lora_int_id
        if not isinstance(i, int) or isinstance(i, bool) or not 0 < i < 2**31:
            raise ValueError(f"LoRARequest.lora_int_id must be an int in [1, 2**31), got {i!r}")
        if not isinstance(self.lora_path, (str, Path)) or not str(self.lora_path):
            raise ValueError(f"LoRARequest {self.lora_name!r}: lora_path must name the adapter's folder")
        object.__setattr__(self, "lora_path", os.path.abspath(os.path.expanduser(str(self.lora_path))))

    # vLLM's shorter spellings
    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path
