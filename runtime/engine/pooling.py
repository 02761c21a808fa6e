"""vLLM's pooling API on the generative engine: `LLM.embed` and `LLM.encode` read the final norm's
output (HF's last_hidden_state) of a prompt's prefill and pool it.

How a prompt's hidden states become one vector (`PoolerConfig`): the checkpoint's sentence-transformers
files when it has them (modules.json, its Pooling module's config.json, a Normalize module), else
vLLM's default for a decoder model run as an embedding model: the last token's, L2-normalized.
`LLM(pooler_config={"pooling_type": "MEAN", "normalize": False})` overrides it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .sampling_params import doc

POOLING_TYPES = ("LAST", "MEAN", "CLS")
TASKS = ("embed", "token_embed")  # what encode() computes; vLLM's other pooling tasks need heads
# sentence-transformers' Pooling config keys, in the order a mode is taken
_SENTENCE_MODES = {"pooling_mode_lasttoken": "LAST", "pooling_mode_mean_tokens": "MEAN",
                   "pooling_mode_cls_token": "CLS"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class PoolerConfig:
    pooling_type: str = "LAST"
    normalize: bool = True
    source: str = "vLLM's default for decoder models"


@dataclass(frozen=True, slots=True)
class PoolingParams:
    """vLLM's: how one embed() or encode() request is pooled."""

    truncate_prompt_tokens: int | None = field(
        default=None, metadata=doc("Keep only the prompt's last k tokens; -1: as many as max_seq_len holds.")
    )
    dimensions: int | None = field(
        default=None,
        metadata=doc("Keep the embedding's first k values (Matryoshka), before it is normalized."),
    )
    normalize: bool | None = field(
        default=None, metadata=doc("L2-normalize the embedding; None: the model's pooler config.")
    )

    def __post_init__(self) -> None:
        for name in ("truncate_prompt_tokens", "dimensions"):
            v = getattr(self, name)
            low = -1 if name == "truncate_prompt_tokens" else 1
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < low or v == 0):
                raise ValueError(f"PoolingParams.{name} must be None or an int >= {max(low, 1)}"
                                 f"{' (or -1)' if low < 0 else ''}, got {v!r}")  # fmt: skip
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise ValueError(f"PoolingParams.normalize must be None, True or False, got {self.normalize!r}")


def check_pooler_config(given: Mapping[str, Any] | None) -> None:
    """LLM's pooler_config, checked where it enters."""
    if given is None:
        return
    if not isinstance(given, Mapping) or set(given) - {"pooling_type", "normalize"}:
        raise ValueError(f"pooler_config takes pooling_type and normalize, got {given!r}")
    kind = given.get("pooling_type", "LAST")
    if not isinstance(kind, str) or kind.upper() not in POOLING_TYPES:
        raise ValueError(
            f"pooler_config pooling_type must be one of {', '.join(POOLING_TYPES)}, got {kind!r}"
        )
    if not isinstance(given.get("normalize", True), bool):
        raise ValueError(f"pooler_config normalize must be True or False, got {given['normalize']!r}")


def pooler_config(checkpoint: Path | None, given: Mapping[str, Any] | None) -> PoolerConfig:
    """`given` (LLM's pooler_config, checked) over the checkpoint's sentence-transformers files over
    vLLM's default; the files are not read when `given` sets both fields."""
    given = given or {}
    whole = {"pooling_type", "normalize"} <= set(given)
    base = _sentence_transformers(checkpoint) if checkpoint is not None and not whole else None
    base = base or PoolerConfig()
    if not given:
        return base
    kind = given.get("pooling_type", base.pooling_type).upper()
    return PoolerConfig(kind, given.get("normalize", base.normalize), "pooler_config")


def _sentence_transformers(checkpoint: Path) -> PoolerConfig | None:
    modules_file = checkpoint / "modules.json"
    if not modules_file.is_file():
        return None
    try:
        modules = json.loads(modules_file.read_text())
        kinds = {m["type"].rsplit(".", 1)[-1]: m.get("path", "") for m in modules}
        pooling = json.loads((checkpoint / kinds["Pooling"] / "config.json").read_text())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(
            f"{checkpoint}: its sentence-transformers pooling config cannot be read: {exc}"
        ) from None
    extra = [t for t in kinds if t not in ("Transformer", "Pooling", "Normalize")]
    if extra:
        # A Dense projection (stella-style) would change the vector and its size: not run, refused.
        raise ValueError(
            f"{checkpoint}: its sentence-transformers modules include {', '.join(extra)}, which fastpath does "
            "not run; pass pooler_config with pooling_type and normalize to pool the hidden states anyway"
        )
    modes = [mode for key, mode in _SENTENCE_MODES.items() if pooling.get(key)]
    others = [
        k for k, v in pooling.items() if k.startswith("pooling_mode_") and v and k not in _SENTENCE_MODES
    ]
    if len(modes) != 1 or others:
        raise ValueError(
            f"{checkpoint}: sentence-transformers pooling {pooling} is not one of last, mean or cls"
        )
    return PoolerConfig(modes[0], "Normalize" in kinds, "the checkpoint's sentence-transformers config")


def pool(hidden: torch.Tensor, lens: list[int], pooling_type: str) -> torch.Tensor:
    """Each sequence's vector [S, H] from the hidden states of its tokens, in order [sum(lens), H]."""
    ends = torch.tensor(lens, device=hidden.device).cumsum(0)
    if pooling_type == "LAST":
        return hidden[ends - 1]
    if pooling_type == "CLS":
        return hidden[ends - torch.tensor(lens, device=hidden.device)]
    owner = torch.repeat_interleave(
        torch.arange(len(lens), device=hidden.device), torch.tensor(lens, device=hidden.device)
    )
    sums = torch.zeros(len(lens), hidden.shape[1], dtype=torch.float32, device=hidden.device)
    sums.index_add_(0, owner, hidden.float())
    return sums / torch.tensor(lens, device=hidden.device, dtype=torch.float32)[:, None]


def finish(vector: torch.Tensor, normalize: bool, dimensions: int | None) -> torch.Tensor:
    """vLLM's order: the first `dimensions` values, then the L2 norm (over the last dimension)."""
    vector = vector.float()
    if dimensions is not None:
        if dimensions > vector.shape[-1]:
            raise ValueError(f"dimensions {dimensions} is more than the model's {vector.shape[-1]}")
        vector = vector[..., :dimensions]
    return F.normalize(vector, p=2, dim=-1) if normalize else vector
