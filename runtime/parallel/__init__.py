"""Tensor parallelism on torch.distributed (NCCL on GPUs, gloo on the CPU).

- `sharding`: which heads, rows and columns of each weight a rank holds (Megatron-style).
- `collectives`: `TPContext`, the model's all-reduces and its logits gather.
- `messages`: rank 0's per-step host inputs, broadcast to the workers.
- `state`: a process's place in the group, and what rank 0 knows of the others' health.
- `launcher`: spawning the worker processes, or joining the ranks torchrun started.
- `watch`: rank 0's watch over the processes it spawned.
- `worker`: a worker rank's loop: run the steps rank 0 sends.
"""
