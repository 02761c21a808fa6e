"""The model: HF configs and presets, layers, the causal LM, its weights and tokenizer, and how a
tensor-parallel rank's shard is cut from them (sharding, the checkpoint name map, collectives)."""
