"""This process's place in a tensor-parallel group: its rank, its process groups, the step channel,
and what rank 0 knows about the health of the others."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..model.collectives import TPContext
from ..runner.kv_cache import CacheSizing
from .messages import Channel, Op

if TYPE_CHECKING:
    from .watch import WorkerSet

STOP_S = 10.0  # the most rank 0 waits for its workers to take the stop message
SETTLE_S = 10.0  # how long an abandoned send gets to fail once its worker has ended
EXIT_GRACE_S = 15.0  # how long a rank that posted its error gets to exit, so the report can say how it ended
log = logging.getLogger("fastpath.parallel")


class WorkerLost(RuntimeError):
    """Another rank of the tensor-parallel group died or failed; the engine cannot continue."""


class RankFailed(RuntimeError):
    """One rank's start-up failed; the message begins with that rank."""

    def __init__(self, rank: int, message: str) -> None:
        super().__init__(f"rank {rank}: {message}")
        self.rank = rank


def check_group(tensor_parallel_size: int, parallel: ParallelState | None) -> None:
    world = parallel.world if parallel is not None else 1
    if tensor_parallel_size != world:
        raise ValueError(
            f"tensor_parallel_size={tensor_parallel_size} but this executor is in a group of {world}: "
            "construct it through LLM(..., tensor_parallel_size=...)"
        )


@dataclass(slots=True, eq=False)
class ParallelState:
    """One rank's handle on its group; rank 0 (the driver) runs the scheduler and sends the steps."""

    rank: int
    world: int
    device: torch.device
    tp: TPContext  # the model's collectives, on the device group
    channel: Channel  # step messages from rank 0, on a gloo group
    store: Any  # a torch.distributed Store, prefixed for this engine: start-up statuses and errors
    timeout_s: float
    groups: tuple[Any, ...]  # the groups this engine created, destroyed at close
    owns_default_group: bool  # a spawned group's default process group is this engine's too
    workers: WorkerSet | None = None  # rank 0 of a spawned group watches its worker processes
    broken: bool = field(default=False)
    restore_threads: int | None = None  # the caller's intra-op thread count, given back at close

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    def send(self, op: Op, step=None) -> None:
        self.channel.send(op, step)

    def send_adapter(self, slot: int, weights: dict) -> None:
        self.channel.send_adapter(slot, weights)

    def agree_on_cache(self, sizing: CacheSizing) -> CacheSizing:
        """Block ids come from rank 0's allocator, so every rank's KV cache has the blocks the fewest fit."""
        t = torch.tensor([sizing.num_blocks], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.channel.group)
        if int(t) == sizing.num_blocks:
            return sizing
        return CacheSizing(sizing.block_size, int(t), f"the fewest any rank fits ({sizing.reason})")

    def wait(self, event: torch.cuda.Event) -> None:
        """Wait for rank 0's step on the device, raising as soon as a worker is seen to die.

        A dead peer leaves NCCL kernels waiting forever, so rank 0 polls rather than blocks.
        """
        if self.workers is None:
            event.synchronize()  # under torchrun its agent stops every rank when one dies
            return
        while not event.query():
            self.workers.check()
            time.sleep(0)

    # --- failures ---------------------------------------------------------------------------------

    def post_error(self, exc: BaseException) -> None:
        """A worker leaves its error for rank 0 to report, before it exits."""
        try:
            self.store.set(f"error/{self.rank}", f"{type(exc).__name__}: {exc}")
        except Exception:  # the store lives on rank 0, which may itself be gone
            log.exception("rank %d could not post its error", self.rank)

    def posted_error(self, rank: int) -> str | None:
        key = f"error/{rank}"
        try:
            return self.store.get(key).decode() if self.store.check([key]) else None
        except Exception:
            return None

    def explain(self, exc: BaseException) -> BaseException:
        """The error rank 0 raises for `exc`: a WorkerLost naming the rank when another rank is at fault."""
        if isinstance(exc, WorkerLost):
            self.broken = True
            return exc
        deaths = self.workers.deaths(grace_s=2.0) if self.workers is not None else {}
        errors = {r: e for r in range(1, self.world) if (e := self.posted_error(r)) is not None}
        if errors and not deaths and self.workers is not None:
            deaths = self.workers.deaths(
                grace_s=EXIT_GRACE_S
            )  # a rank that posted an error is on its way out
        culprits = sorted(set(deaths) | set(errors))
        if not culprits and self.workers is not None:
            deaths = (
                self.workers.unresponsive()
            )  # alive, but stopped or stuck: a collective timed out on them
            culprits = sorted(deaths)
        if not culprits:
            return exc
        self.broken = True
        parts = []
        for r in culprits:
            text = f"tensor-parallel rank {r}"
            if r in deaths:
                text += f" {deaths[r]}"
            if r in errors:
                text += f" after it raised {errors[r]}"
            parts.append(text)
        return WorkerLost("; ".join(parts))

    # --- start-up agreement -----------------------------------------------------------------------

    def agree(self, failure: BaseException | None) -> BaseException | None:
        """Every rank reports how its start-up went. Returns the failure to raise, its rank named, or None.

        A rank that failed reports and returns at once; the others wait for every report, at most
        `timeout_s`, and name any rank that never reported.
        """
        if failure is not None and self.is_driver:
            failure = self.explain(failure)
        status = {"ok": failure is None, "error": "" if failure is None else str(failure)}
        self.store.set(f"startup/{self.rank}", json.dumps(status))
        if failure is not None:
            return RankFailed(self.rank, str(failure))
        deadline = time.monotonic() + self.timeout_s
        pending = [r for r in range(self.world) if r != self.rank]
        while pending:
            for r in list(pending):
                if self.store.check([f"startup/{r}"]):
                    pending.remove(r)
                    peer = json.loads(self.store.get(f"startup/{r}"))
                    if not peer["ok"]:
                        self.broken = True
                        return RankFailed(r, peer["error"])
            if self.workers is not None:
                dead = self.workers.deaths(grace_s=0.0)
                if dead:
                    self.broken = True
                    r = min(dead)
                    return RankFailed(r, f"{self.posted_error(r) or 'no error reported'} ({dead[r]})")
            if pending and time.monotonic() > deadline:
                self.broken = True
                return RankFailed(pending[0], f"did not finish start-up within {self.timeout_s:g} s")
            time.sleep(0.02)
        return None

    # --- shutdown ---------------------------------------------------------------------------------

    def stop_workers(self) -> None:
        """Rank 0 tells the workers to leave their step loop; a broken group has no one left to tell."""
        if self.workers is not None and self.workers.deaths(grace_s=0.0):
            self.broken = True
        if not self.is_driver or self.broken:
            return
        if not self.channel.send_bounded(Op.STOP, min(self.timeout_s, STOP_S)):
            self.broken = True  # a worker is gone or stuck: close() ends it, and the error says which
            log.info("the tensor-parallel workers did not take the stop message within %g s", STOP_S)

    def close(self) -> None:
        """Take this engine's process groups down, then join (or, failing that, end) the workers.

        The groups go first: the workers take theirs down at the same time, after rank 0's STOP,
        and a backend whose teardown waits for its peers finds them there. A send that rank 0 gave up
        on (a stopped or stuck worker never took it) ends the workers first instead, so the send fails
        rather than still running in the backend's thread while the group is destroyed or the
        process exits (which aborts the process).
        """
        if self.broken and self.device.type == "cuda":
            # Kernels of a collective whose peer is gone never finish: abort them rather than wait.
            try:
                dist.distributed_c10d._abort_process_group(self.tp.group)
            except Exception as exc:
                log.warning("could not abort the NCCL group: %s", exc)
        if self.broken and self.workers is not None and self.channel.abandoned:
            self.workers.close(timeout_s=0.5)  # the ones a send still waits on are stopped or stuck
            self.channel.settle(timeout_s=SETTLE_S)
        try:
            if self.owns_default_group:
                dist.destroy_process_group()
            else:
                for group in self.groups:
                    dist.destroy_process_group(group)
        except Exception as exc:
            log.warning("could not destroy the tensor-parallel process groups: %s", exc)
        if self.workers is not None:
            self.workers.close(timeout_s=10.0)
        if self.restore_threads is not None:
            torch.set_num_threads(self.restore_threads)
