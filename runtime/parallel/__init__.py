"""Tensor-parallel process orchestration on torch.distributed (NCCL on GPUs, gloo on the CPU).

The model math of a shard (which heads, rows and columns a rank holds; its collectives) is in
model/. Here:
- `messages`: rank 0's per-step payloads, broadcast to the workers.
- `state`: a process's place in the group, and what rank 0 knows of the others' health.
- `launcher`: spawning the worker processes, or joining the ranks torchrun started.
- `watch`: rank 0's watch over the processes it spawned.
- `worker`: a worker rank's loop: its runner runs the steps rank 0 sends.
"""
