"""A step's inputs as host data: everything the forward needs, and nothing about sequences.

One rank runs a payload as is; under tensor parallelism rank 0 broadcasts it and every rank runs the
same step on its shard.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .penalties import PenaltyFill
from .sampler import SamplingTensors


@dataclass(slots=True)
class DecodeStep:
    num_seqs: int  # live rows; rows past this are graph padding
    packed: torch.Tensor  # [rows, FIXED_COLUMNS + W] int64 (decode_inputs.py's layout)
    sampling: SamplingTensors | None  # [rows] on the host; None: every row is greedy
    uses_prev: bool  # rows whose SRC_ROW is set take their token from the previous step's tokens
    guided: bool = False  # apply the guided decoder's bitmask (one rank only)
    top_logprobs: bool = False  # a row asked for top-k logprobs: the step returns them
    words: bool = False  # a row bans bad words of several tokens (runner/penalties.py)
    lora: torch.Tensor | None = None  # [rows] int64 LoRA slot of each row (-1: none); None: no row has one


@dataclass(slots=True)
class PrefillStep:
    """int64 host tensors: T tokens of S sequences, R of which sample."""

    ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slots: torch.Tensor  # [T] cache slot of each token
    tables: torch.Tensor  # [S, W] block tables, zero-padded
    ends: torch.Tensor  # [S] tokens in the cache after this step
    query_lens: torch.Tensor  # [S]
    logits_rows: torch.Tensor  # [R] the token whose logits each sampling sequence samples from
    sampling: SamplingTensors | None  # [R]; None: greedy
    top_logprobs: bool = False
    penalty: PenaltyFill | None = None  # the sequences' penalty-table work, before sampling
    words: bool = False  # a sampling row bans bad words of several tokens (runner/penalties.py)
    # [K, 2]: (index in ids, row of the previous step's tokens) for tokens still on the device
    pending: torch.Tensor | None = None
    lora: torch.Tensor | None = None  # [T] int64 LoRA slot of each token (-1: none); None: no token has one
