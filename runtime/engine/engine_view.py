"""`llm.llm_engine`: the part of vLLM's LLMEngine that scripts ported from vLLM read (its tokenizer
and its model config). Anything else is an AttributeError that says what fastpath has instead."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ModelConfigView:
    """vLLM's ModelConfig fields that scripts read, from the engine's own config."""

    model: str
    max_model_len: int
    dtype: Any
    hf_config: Any  # fastpath's ModelConfig: the checkpoint's config.json as the engine reads it
    tokenizer: str | None


class EngineView:
    __slots__ = ("_llm",)

    def __init__(self, llm: Any) -> None:
        self._llm = llm

    def get_tokenizer(self) -> Any:
        return self._llm.get_tokenizer()

    @property
    def model_config(self) -> ModelConfigView:
        c = self._llm.config
        model = str(c.checkpoint) if c.checkpoint is not None else f"random:{c.model.name}"
        tokenizer = str(c.tokenizer) if c.tokenizer is not None else (model if c.checkpoint else None)
        return ModelConfigView(model, c.max_seq_len, c.dtype, c.model, tokenizer)

    def get_model_config(self) -> ModelConfigView:
        return self.model_config

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"llm.llm_engine.{name}: fastpath has no vLLM LLMEngine; llm.llm_engine offers get_tokenizer() "
            "and model_config, and the LLM itself submit(), stats() and the rest of docs/api.md"
        )
