"""A worker rank: build the engine's shard, then run whatever steps rank 0 broadcasts."""

from __future__ import annotations

import logging
import os
import sys
import traceback
from datetime import timedelta
from typing import TYPE_CHECKING

import torch.distributed as dist

from .messages import Op

if TYPE_CHECKING:
    from ..runner.runner import ModelRunner
    from .launcher import WorkerSpec
    from .messages import Channel

log = logging.getLogger("fastpath.parallel")


def serve(runner: ModelRunner, channel: Channel, until: Op = Op.STOP) -> None:
    """Run rank 0's steps on this rank's shard until `until` arrives.

    Tokens are sampled from logits every rank has whole, so each rank samples the same tokens and
    keeps the last step's as the next decode step's inputs, exactly as rank 0 does.
    """
    last = None
    while True:
        op, step = channel.recv()
        if op is until:
            return
        if op is Op.DECODE:
            last = runner.run_decode(step, last).tokens
        elif op is Op.PREFILL:
            last = runner.run_prefill(step).tokens
        elif op is Op.PREFILL_LOGITS:
            runner.run_prompt(step)
        elif op is Op.PREFILL_HIDDEN:
            runner.run_hidden(step)
        elif op is Op.LOAD_ADAPTER:
            runner.load_adapter(*step)
        elif op is Op.STOP:
            raise RuntimeError("rank 0 stopped the engine during start-up")
        else:
            raise RuntimeError(f"unexpected {op.name} from rank 0")


def worker_main(spec: WorkerSpec) -> None:
    """Entry point of a spawned worker process."""
    from .launcher import build_state, share_cores

    os.environ["FASTPATH_PROGRESS"] = "0"  # rank 0 shows progress for the group
    share_cores(spec.config.device, spec.world)
    store = dist.TCPStore(
        "127.0.0.1", spec.port, spec.world, is_master=False, timeout=timedelta(seconds=spec.timeout_s)
    )
    store.set(f"checkin/{spec.rank}", "1")
    state = build_state(
        spec.rank, spec.world, spec.config.device, store, spec.engine, spec.timeout_s, owns_default_group=True
    )
    executor = None
    try:
        executor = spec.executor_cls(spec.config, spec.hooks, parallel=state)
        executor.start()
        serve(executor.runner, state.channel)
    except BaseException as exc:
        state.broken = True  # the device may hold a collective that never finishes: do not wait on it
        state.post_error(exc)
        traceback.print_exc()
        sys.exit(1)
    finally:
        if executor is not None:
            executor.shutdown()
        state.close()
