"""One step on the device: the `ModelRunner` and what it owns (the model, the KV cache, attention,
CUDA graphs, the sampling step), the step payloads it runs, and the config it is built from.
Tensor-parallel workers serve a runner with the payloads rank 0 broadcasts."""
