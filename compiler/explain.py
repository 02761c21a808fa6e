"""`bin/compile --explain`: the Plan in words, with each FMHA library's availability on this machine."""

from __future__ import annotations

from collections.abc import Callable

from fastpath.vocab import allreduce_policy

from .plan import Plan

# plan -> {library: reasons it is unavailable here (empty: available)}, or one line saying why there is no answer
Availability = Callable[[Plan], dict[str, list[str]] | str]


def explain(plan: Plan, availability: Availability | None = None) -> str:
    """`availability`: which FMHA libraries load here; by default the runtime is asked (compiler/native.py)."""
    if availability is None:
        from .native import runtime_availability as availability
    decisions = {d.subject: d for d in plan.decisions}
    lines = [
        f"{plan.name}: {plan.manifest_path} (sha256 {plan.manifest_sha256[:16]})",
        f"  package  {plan.package} (distribution {plan.distribution})",
        f"  model    {plan.model}, {plan.dtype}, seed {plan.seed}",
        f"  runtime  device {plan.device}, max_batch_size {plan.max_batch_size}, "
        f"max_seq_len {plan.max_seq_len}, tensor_parallel_size {plan.tensor_parallel_size}",
        "  hooks",
    ]
    hooks = [d for d in plan.decisions if d.subject.startswith("hooks.")]
    lines += _table([(d.value, d.subject.removeprefix("hooks."), d.reason) for d in hooks])
    gates = [d for d in plan.decisions if d.subject in ("cuda_graphs", "guided_decoding", "tensor_parallel")]
    lines.append("  gates")
    lines += _table([(d.value, d.subject, d.reason) for d in gates])
    if plan.graph_batch_sizes is not None:
        lines.append(f"    cuda graph batch sizes: {', '.join(map(str, plan.graph_batch_sizes))}")

    report = availability(plan)
    where = report if isinstance(report, str) else "availability on this machine"
    lines.append(f"  fmha order: {decisions['fmha.order'].reason} ({where})")
    name_width = max(map(len, plan.fmha_order))
    for i, name in enumerate(plan.fmha_order, 1):
        lines.append(f"    {i}. {name:<{name_width}}  {_status(report, name)}".rstrip())
    lines.append(f"  host dispatch: {plan.dispatch_mode}, {decisions['host_dispatch'].reason}")
    if plan.tensor_parallel_size > 1:
        lines.append(f"  all-reduce: {allreduce_policy('auto')} (LLM(tp_allreduce='nccl') for NCCL alone)")
    return "\n".join(lines) + "\n"


def _table(rows: list[tuple[str, str, str]]) -> list[str]:
    value_width = max(3, *(len(r[0]) for r in rows))  # "off" and "on" line up
    name_width = max(len(r[1]) for r in rows)
    return [f"    {value:<{value_width}}  {name:<{name_width}}  {reason}" for value, name, reason in rows]


def _status(report: dict[str, list[str]] | str, name: str) -> str:
    if isinstance(report, str):
        return ""
    reasons = report.get(name)
    if reasons is None:
        return "unknown"
    return "unavailable: " + "; ".join(reasons) if reasons else "available"
