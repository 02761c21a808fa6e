"""Starting a tensor-parallel group: rank 0 (the caller) spawns one worker process per other rank with
torch.multiprocessing, or every rank joins the group that torchrun started.

Two process groups per engine: a device group for the model's collectives (NCCL on CUDA, gloo on
CPU), bounded by `timeout_s`, and a gloo group that carries rank 0's step messages, where workers
may wait for as long as the engine is idle.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import pickle
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fastpath.vocab import MULTICAST_OFF_ENV

from ..model.collectives import TPContext
from ..model.sharding import tp_problems
from ..runner.config import EngineConfig
from .messages import Channel
from .state import ParallelState
from .watch import WorkerSet

log = logging.getLogger("fastpath.parallel")

START_S = 120.0  # workers get at least this long to start (import torch, reach the store)
_IDLE = timedelta(days=7)  # how long a worker waits for rank 0's next step
_engines = itertools.count()  # torchrun ranks build their engines in the same order, so ids agree


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What a spawned worker needs to build its rank of the engine."""

    rank: int
    world: int
    port: int
    engine: int
    config: EngineConfig
    hooks: Any
    executor_cls: type
    timeout_s: float


def under_torchrun() -> bool:
    return dist.is_initialized() or "TORCHELASTIC_RUN_ID" in os.environ


def start_group(config: EngineConfig, hooks: Any, executor_cls: type, timeout_s: float):
    """(this process's ParallelState, its rank's EngineConfig)."""
    world = config.tensor_parallel_size
    problems = tp_problems(config.model, world)
    if problems:
        raise ValueError(f"tensor_parallel_size={world}: " + "; ".join(problems))
    if config.device.type == "cuda" and torch.cuda.device_count() < world:
        raise ValueError(
            f"tensor_parallel_size={world} needs {world} CUDA devices, but {torch.cuda.device_count()} are visible"
        )
    keep_multicast_off()
    threads = share_cores(config.device, world)
    try:
        if under_torchrun():
            state, config = _join_torchrun(config, timeout_s)
        else:
            state, config = _spawn(config, hooks, executor_cls, timeout_s)
    except BaseException:
        torch.set_num_threads(threads)
        raise
    state.restore_threads = threads
    return state, config


def keep_multicast_off() -> None:
    """NVLink multicast off in this process and the workers it spawns (they inherit the environment),
    before any communicator or symmetric memory exists: set to off where unset or set otherwise."""
    for name, off in MULTICAST_OFF_ENV.items():
        if os.environ.get(name) != off:
            if name in os.environ:
                log.warning(
                    "%s=%s turns NVLink multicast on; the engine sets it to %s", name, os.environ[name], off
                )
            os.environ[name] = off


def share_cores(device: torch.device, world: int) -> int:
    """On the CPU the ranks share the machine's cores: each takes its share of intra-op threads, so
    that no rank's idle threads spin on a core another rank computes on (a tenfold slowdown).
    Returns the thread count to restore when the engine closes."""
    before = torch.get_num_threads()
    if device.type == "cpu":
        threads = max(1, (os.cpu_count() or 1) // world)
        if before > threads:
            log.info("tensor parallelism on the CPU: %d intra-op threads per rank", threads)
            torch.set_num_threads(threads)
    return before


def rank_config(config: EngineConfig, rank: int) -> EngineConfig:
    """Rank r runs on cuda:r (the r-th visible device); on the CPU nothing changes."""
    if config.device.type != "cuda":
        return config
    return dataclasses.replace(config, device=torch.device("cuda", rank))


def build_state(
    rank: int,
    world: int,
    device: torch.device,
    store: Any,
    engine: int,
    timeout_s: float,
    owns_default_group: bool,
    workers: WorkerSet | None = None,
) -> ParallelState:
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if owns_default_group:
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
        )
    device_group = dist.new_group(
        backend="nccl" if device.type == "cuda" else "gloo", timeout=timedelta(seconds=timeout_s)
    )
    control = dist.new_group(backend="gloo", timeout=_IDLE)
    return ParallelState(
        rank=rank,
        world=world,
        device=device,
        tp=TPContext(rank, world, device_group),
        channel=Channel(control, rank, pin_memory=device.type == "cuda", send_timeout_s=timeout_s),
        store=dist.PrefixStore(f"fastpath/engine{engine}", store),
        timeout_s=timeout_s,
        groups=(device_group, control),
        owns_default_group=owns_default_group,
        workers=workers,
    )


def _join_torchrun(config: EngineConfig, timeout_s: float):
    world = config.tensor_parallel_size
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=timeout_s))
    if dist.get_world_size() != world:
        raise ValueError(
            f"tensor_parallel_size={world}, but torchrun started {dist.get_world_size()} processes: "
            "run one process per rank"
        )
    rank = dist.get_rank()
    config = rank_config(config, int(os.environ.get("LOCAL_RANK", rank)))
    store = dist.distributed_c10d._get_default_store()
    state = build_state(
        rank, world, config.device, store, next(_engines), timeout_s, owns_default_group=False
    )
    return state, config


def _spawn(config: EngineConfig, hooks: Any, executor_cls: type, timeout_s: float):
    from .worker import worker_main

    world = config.tensor_parallel_size
    try:
        pickle.dumps((hooks, executor_cls))
    except Exception as exc:
        raise TypeError(
            f"tensor_parallel_size={world} sends the hooks and executor class to worker processes, "
            f"and they cannot be pickled: {exc}"
        ) from exc
    store = dist.TCPStore(
        "127.0.0.1", 0, world, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
    )
    engine = next(_engines)
    ctx = mp.get_context("spawn")
    procs = {}
    for rank in range(1, world):
        spec = WorkerSpec(
            rank, world, store.port, engine, rank_config(config, rank), hooks, executor_cls, timeout_s
        )
        proc = ctx.Process(target=worker_main, args=(spec,), name=f"fastpath-tp-rank{rank}", daemon=True)
        proc.start()
        procs[rank] = proc
    workers = WorkerSet(procs)
    if config.device.type == "cuda":
        # The caller is rank 0 and must outlive a failed worker: on a NCCL error or timeout the
        # watchdog aborts the communicators (mode 2) instead of ending this process (the default, 3).
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    try:
        workers.await_check_in(store, max(timeout_s, START_S))
        state = build_state(0, world, rank_config(config, 0).device, store, engine, timeout_s, True, workers)
    except BaseException:
        workers.close(timeout_s=0.5)
        raise
    return state, rank_config(config, 0)
