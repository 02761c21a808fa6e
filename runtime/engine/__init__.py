"""The engine's host side: the `LLM` facade, requests and their sequences, the scheduler, and the
executor whose overlap loop turns scheduled batches into steps for its `ModelRunner`."""
