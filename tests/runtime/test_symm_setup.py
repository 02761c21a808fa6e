"""The symmetric-memory all-reduce's set-up is collective: whatever one rank finds, every rank
leaves it on the same path, and none is left waiting in a collective (two gloo ranks on the CPU,
where symmetric memory cannot be allocated)."""

import json
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, port: int, out: str, used_on: int) -> None:
    from fastpath.runtime.model import symm_allreduce

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    group = dist.new_group(backend="gloo")
    try:
        results = []
        if rank == used_on:  # this rank's process served an earlier engine's group of the same name
            symm_allreduce._set_up.add(group.group_name)
        results.append(symm_allreduce.setup(group, rank, torch.device("cpu"), torch.float32, 1 << 20)[1])
        results.append(symm_allreduce.setup(group, rank, torch.device("cpu"), torch.float32, 1 << 20)[1])
        with open(f"{out}.{rank}", "w") as f:
            json.dump(results, f)
    finally:
        dist.destroy_process_group()


def _run(tmp_path, used_on: int) -> list[list[str]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "why")
    mp.start_processes(_rank, args=(port, out, used_on), nprocs=2, join=True, start_method="spawn")
    return [json.load(open(f"{out}.{r}")) for r in range(2)]


def test_every_rank_falls_back_together_when_symmetric_memory_fails(tmp_path):
    rank0, rank1 = _run(tmp_path, used_on=-1)
    # Both fail at the same stage, each naming its own failure, and both return: nobody hangs.
    assert "symmetric memory failed to" in rank0[0] and "symmetric memory failed to" in rank1[0]
    # A second engine in each process: its group's name was used, by every rank at once.
    assert rank0[1].startswith("an earlier engine in this process") and rank1[1] == rank0[1]


def test_one_rank_that_may_not_try_takes_the_other_with_it(tmp_path):
    rank0, rank1 = _run(tmp_path, used_on=1)
    assert rank0[0].startswith("an earlier engine") and rank1[0] == rank0[0]
    assert rank0[1] == rank0[0] and rank1[1] == rank1[0]  # rank 0 never allocated: still together
