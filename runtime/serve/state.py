"""What every handler of one server shares: the engine, the settings, the gate, the metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .config import AdmissionGate, ServeConfig
from .errors import RequestInvalid, ServeError
from .metrics import ServerMetrics


@dataclass(slots=True)
class ServerState:
    llm: Any  # fastpath.runtime.LLM, or a generated package's
    config: ServeConfig
    model_name: str
    gate: AdmissionGate
    metrics: ServerMetrics
    created: int  # when the server started (unix seconds), for /v1/models
    routes: frozenset[str] = frozenset()  # the paths metrics label by; any other is "other"
    aliases: tuple[str, ...] = ()  # further names requests may use (vLLM's --served-model-name a b)
    adapters: dict[str, Any] = field(default_factory=dict)  # model name -> LoRARequest (--lora-modules)
    # vLLM's `root` of each card: the model `fastpath serve` was given (a package: its served name).
    model_path: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """Every name the server answers to; responses carry the first."""
        return (self.model_name, *self.aliases)

    def check_model(self, model: str | None) -> Any:
        """The LoRARequest a request's `model` names (None: the base model); 404 for an unknown name."""
        if model is None or model in self.names:
            return None
        adapter = self.adapters.get(model)
        if adapter is None:
            served = ", ".join(map(repr, [*self.names, *self.adapters]))
            raise ServeError(f"the model {model!r} does not exist; this server serves {served}", "model", 404)
        return adapter

    def reply_name(self, model: str | None, lora: Any) -> str:
        """The model a response names: the adapter's, when the request ran one (`lora`, what
        check_model gave when the request came: the name may be unloaded since), as vLLM does."""
        return model if lora is not None and model is not None else self.model_name

    def check_chat_template(self, chat_template: str | None) -> None:
        if chat_template is not None and not self.config.trust_request_chat_template:
            raise RequestInvalid(
                "a request's own chat template runs on this server's CPU, so it is refused unless the "
                "server was started with --trust-request-chat-template",
                "chat_template",
            )

    def closed_reason(self) -> str | None:
        """Why the engine no longer takes requests, or None while it does."""
        return self.llm.closed_reason
