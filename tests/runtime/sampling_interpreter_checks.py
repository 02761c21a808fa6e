"""Runs under TRITON_INTERPRET=1 (a subprocess of test_sampling_kernels.py): the fused general sampler
on the CPU against its torch definition, on rows that take the fast path and rows that need the slow one.

Small chunks, so a row spans several programs of the row-parallel passes as it does on a GPU.
"""

import contextlib
import os
import sys

import torch
import triton
import triton.language as tl

from fastpath.runtime.kernels import sampling_rank, sampling_triton
from fastpath.runtime.kernels.sampling import (
    BIAS_BIT,
    PROMPT_BIT,
    STOP_BIT,
    rank_counts_reference,
    sample_reference,
)
from fastpath.runtime.kernels.sampling_jit import bucket, bucket_floor, distance, float_key, signed_key
from fastpath.runtime.runner.penalties import PenaltyTable
from fastpath.runtime.runner.sampler import SamplingTensors

assert os.environ.get("TRITON_INTERPRET") == "1", "run me with TRITON_INTERPRET=1"
g = torch.Generator().manual_seed(0)
VOCAB, CHUNK, BLOCK = 1200, 256, 128


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else f": {detail}"))
    return ok


def table(rows: int, biased: bool = False, allow_every: int = 3) -> PenaltyTable:
    """A table whose slots 1..rows hold prompt tokens, counts and stop tokens; `biased`, also biases:
    a slot in three bans every token but a few (allowed_token_ids), the others bias some up or down
    and ban some, overlapping the penalized tokens."""
    t = PenaltyTable(rows + 1, VOCAB, torch.device("cpu"))
    for slot in range(1, rows + 1):
        toks = torch.randint(0, VOCAB, (40,), generator=g)
        t.entries[slot, toks[:15]] |= PROMPT_BIT
        t.entries[slot, toks[10:30]] += torch.randint(1, 4, (20,), generator=g, dtype=torch.int32)
        t.entries[slot, toks[35:]] |= STOP_BIT
        if not biased:
            continue
        if slot % allow_every == 0:
            t.entries[slot] |= BIAS_BIT
            t.biases[slot] = float("-inf")
        some = torch.cat([toks[5:25], torch.randint(0, VOCAB, (30,), generator=g)])
        t.entries[slot, some] |= BIAS_BIT
        t.biases[slot, some] = (torch.randn(len(some), generator=g) * 4).clamp(-100, 100)
        t.biases[slot, some[::7]] = float("-inf")
    t.bits.copy_(t._pack(list(range(rows + 1))))
    return t


def params(rows: int, **cols) -> SamplingTensors:
    return SamplingTensors.neutral(rows, seeds=torch.randint(0, 2**62, (rows,), generator=g), **cols)


SEEN_PATHS: set[int] = set()
SEEN_GATHERS: set[int] = set()  # 0: candidates from hist_kernel's lists, 1: from a pass over the row
LISTED_RANKS: set[bool] = set()  # whether an asking row's rank came from the list of top raw logits
ANY = {2, 3}  # a draw over the whole row: accepted at once, or by the slow path


def compare(
    name, logits, p, num_top=0, paths=None, gather=None, biased=False, allow_every=3, ban_all=False
) -> bool:
    """The kernels equal the definition; `paths` gives each row's allowed paths (see sample()), and
    `gather` whether each row's candidates took a pass over the row (1) or came from the lists (0).
    `ban_all`: every token of every slot banned, so no row has a finite score."""
    rows = logits.shape[0]
    ta = table(rows, biased, allow_every)
    if ban_all:
        ta.entries[1:] |= BIAS_BIT
        ta.biases[1:] = float("-inf")
        ta.bits.copy_(ta._pack(list(range(rows + 1))))
    tb = PenaltyTable(rows + 1, VOCAB, torch.device("cpu"))
    tb._padded.copy_(ta._padded)  # entries and biases
    tb.bits.copy_(ta.bits)
    ref = sample_reference(logits, p, ta.entries, ta.bits, num_top)
    took = torch.zeros(rows, dtype=torch.int32)
    # Ranks, in the rows that ask (two of three): from the sampler's list of top raw logits where it
    # holds them, else from the top-k when the token is among them, else by a pass over the row.
    asks = torch.arange(rows) % 3 != 1
    flagged = SamplingTensors(p.data.clone())
    flagged.data[:, sampling_rank.RANKS_FIELD] = asks.long()
    known = torch.full((rows,), -7, dtype=torch.int32)
    got = sampling_triton.sample(
        logits,
        flagged,
        tb.entries,
        tb.bits,
        num_top,
        chunk=CHUNK,
        block=BLOCK,
        paths=took,
        listed_ranks=known,
    )
    good = True
    gathers = (took >> 3).tolist()
    took = took & 7
    SEEN_PATHS.update(took.tolist())
    SEEN_GATHERS.update(gathers)
    if gather is not None:
        good &= check(f"{name}: gathers", gathers == gather, f"{gathers} != {gather}")
    if paths is not None:
        allowed = [{a} if isinstance(a, int) else a for a in paths]
        ok = all(t in a for t, a in zip(took.tolist(), allowed, strict=True))
        good &= check(f"{name}: paths", ok, f"{took.tolist()} not in {allowed}")
    good &= check(f"{name}: tokens", torch.equal(ref[0], got[0]), f"{ref[0].tolist()} != {got[0].tolist()}")
    good &= check(f"{name}: logprobs", torch.allclose(ref[1], got[1], atol=1e-4), f"{ref[1]} != {got[1]}")
    good &= check(f"{name}: table", torch.equal(ta.entries, tb.entries) and torch.equal(ta.bits, tb.bits))
    if num_top:
        good &= check(f"{name}: top ids", torch.equal(ref[2], got[2]), f"{ref[2]} != {got[2]}")
        good &= check(f"{name}: top logprobs", torch.allclose(ref[3], got[3], atol=1e-4))
    want = rank_counts_reference(logits, got[0])[:, 0].long()
    listed = known >= 0
    good &= check(f"{name}: listed ranks", (known[~asks] == -1).all() and torch.equal(known[listed].long(), want[listed]),
                  f"{known.tolist()} against {want.tolist()}")  # fmt: skip
    LISTED_RANKS.update(listed[asks].tolist())
    top = got[2] if num_top else None
    for given in (known, None):
        counts = sampling_rank.rank_counts(
            logits, flagged, got[0], top, chunk=CHUNK, block=BLOCK // 2, known=given
        )
        ranks = counts.sum(1).long()[asks]
        good &= check(
            f"{name}: ranks", torch.equal(ranks, want[asks]), f"{ranks.tolist()} != {want[asks].tolist()}"
        )
    return good


def rows_mixed(n: int = 12) -> SamplingTensors:
    """Greedy, sampled, penalized and min_tokens rows; the last two keep 1 and ~all tokens."""
    return params(
        n,
        temperature=[0.0, 0.7, 1.0, 1.3, 0.9, 0.0, 1.0, 0.8, 2.0, 1.0, 0.5, 1.0][:n],
        top_k=[0, 0, 50, 5, 0, 0, 200, 50, 0, 1, 0, 2**31 - 1][:n],
        top_p=[1.0, 0.9, 0.95, 1.0, 0.5, 1.0, 0.8, 0.95, 1.0, 1.0, 1e-45, 0.999][:n],
        min_p=[0.0, 0.0, 0.0, 0.1, 0.0, 0.0, 0.0, 0.05, 0.3, 0.0, 0.0, 0.0][:n],
        slots=list(range(1, n + 1)),
        repetition=[1.0, 1.3, 1.0, 0.8, 1.0, 1.5, 1.0, 1.1, 1.0, 1.0, 1.0, 2.0][:n],
        presence=[0.0, 0.5, 0.0, -1.0, 0.0, 0.0, 2.0, 0.5, 0.0, 0.0, 0.0, 0.0][:n],
        frequency=[0.0, 0.0, 0.7, 0.0, -0.5, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0][:n],
        counters=[0, 3, 0, 9, 0, 1, 0, 0, 0, 0, 0, 0][:n],
        min_tokens=[0, 5, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0][:n],
    )


@triton.jit
def _floor_kernel(top_ptr, v_ptr, cut_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    top = tl.load(top_ptr + i)
    v = tl.load(v_ptr + i)
    cut = tl.load(cut_ptr + i)
    kt, kv = signed_key(top), signed_key(v)
    tl.store(out_ptr + i * 4 + 0, bucket(distance(kt, kv)))
    tl.store(out_ptr + i * 4 + 1, tl.where(cut >= 0, kv >= bucket_floor(kt, cut), False).to(tl.int32))
    tl.store(out_ptr + i * 4 + 2, (float_key(v).to(tl.int64) - 2147483648 == kv).to(tl.int32))
    # The 64-bit distance the keys stood for, bucketed by its float's exponent and top mantissa bits.
    d = (float_key(top) - float_key(v)).to(tl.float64)
    e = tl.floor(tl.log2(d))
    m = tl.floor((d / tl.exp2(e) - 1.0) * 8.0)
    tl.store(out_ptr + i * 4 + 3, tl.where(d < 16, d, 16 + (e - 4) * 8 + m).to(tl.int32))


def check_bucket_floor() -> bool:
    """One compare with bucket_floor is the bucket test it replaces, for every cut and distance
    (cut -1 keeps nothing, as in gather_kernel)."""
    n = 4096
    top = torch.randn(n, generator=g) * torch.logspace(-3, 30, n).to(torch.float32)
    v = top - torch.rand(n, generator=g) * torch.logspace(-40, 38, n).float()
    v[:64] = top[:64]  # distance 0
    v[64:96], top[64:96] = -0.0, 0.0  # equal keys
    v[96:128] = float("-inf")
    v = torch.minimum(v, top)
    cut = torch.randint(-1, 256, (n,), generator=g)
    out = torch.empty(n, 4, dtype=torch.int32)
    _floor_kernel[(1,)](top, v, cut, out, N=n)
    b = out[:, 0]
    ok = check("signed keys are float_key - 2**31", bool(out[:, 2].all()))
    ok &= check("bucket of a 32-bit distance", torch.equal(b, out[:, 3]), f"{(b != out[:, 3]).sum()} differ")
    want = (b <= cut) & (cut >= 0)
    bad = (want != out[:, 1].bool()).nonzero().flatten()[:5].tolist()
    return ok & check("k >= bucket_floor(top, cut) is bucket <= cut", not bad, f"rows {bad}")


SCRATCH = []
_scratch_init = sampling_triton._Scratch.__init__


def _remember(self, *args, **kwargs):
    _scratch_init(self, *args, **kwargs)
    SCRATCH[:] = [self]


sampling_triton._Scratch.__init__ = _remember


def list_counts() -> list[list[int]]:
    """How many tokens each row's lists counted in the last sample() (past their ends included)."""
    return SCRATCH[0].lfill.tolist()


@contextlib.contextmanager
def short_lists():
    """Candidate lists no longer than a cut's caps: more tokens than that lie at or above a floor, so
    every row's list overflows and its candidates take the histogram and a pass over the row."""
    listed = sampling_triton.LISTED, sampling_triton.RAW_LISTED
    sampling_triton.LISTED, sampling_triton.RAW_LISTED = (
        sampling_triton.CANDIDATES,
        sampling_triton.RAW_CANDIDATES,
    )
    try:
        yield
    finally:
        sampling_triton.LISTED, sampling_triton.RAW_LISTED = listed


def main() -> bool:
    good = check_bucket_floor()
    peaked = (torch.randn(12, VOCAB, generator=g) * 4).half()
    # Greedy rows take neither path. The last row keeps 99.9% of the mass: it draws over the whole
    # row. Top-k 200 lies within the list of the tokens above the floor, but past a cut's 128
    # candidates: there it draws over the whole row too (the top-k mass top-p needs is unknown).
    listed = [0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, ANY]
    good &= compare(
        "mixed rows, top-20 logprobs", peaked, rows_mixed(), num_top=20, paths=listed, gather=[0] * 12
    )
    with short_lists():
        paths = [0, 1, 1, 1, 1, 0, ANY, 1, 1, 1, 1, ANY]
        good &= compare("mixed rows, cut", peaked, rows_mixed(), num_top=20, paths=paths, gather=[1] * 12)
    # Biases and bans (logit_bias, bad_words; every third row an allow-list), greedy rows among them.
    good &= compare("biased rows, top-20 logprobs", peaked, rows_mixed(), num_top=20, biased=True)
    with short_lists():
        good &= compare("biased rows, cut", peaked, rows_mixed(), num_top=20, biased=True)
    # Every row an allow-list (about 40 tokens; every other score -inf): the score list holds the
    # finite scores, so each sampled row is decided from its candidates, with no pass over the row.
    allow = rows_mixed()
    allowed_paths = [0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1]
    good &= compare(
        "allow-list rows, top-20 logprobs", peaked, allow, num_top=20, paths=allowed_paths, gather=[0] * 12,
        biased=True, allow_every=1,
    )  # fmt: skip
    # No finite score in any row (an allow-list whose tokens bad words or a grammar ban): nothing to
    # draw, so every row, sampled or not, takes the greedy token, the first, as the definition does.
    good &= compare(
        "rows with no finite score", peaked, rows_mixed(), num_top=20, paths=[0] * 12, ban_all=True
    )
    # Equal values: a grid of 0.25 (many ties per bucket); few allowed tokens, the rest -inf (the
    # top-20 logprobs reach into the -inf ties); 15 ties at the top, then 200 near-equal values
    # sharing a bucket. The -inf rows' floor is -inf: their lists overflow.
    odd = (torch.randn(6, VOCAB, generator=g) * 3).mul(4).round().div(4)
    odd[2:4] = float("-inf")
    odd[2:4, torch.randint(0, VOCAB, (7,), generator=g)] = torch.randn(2, 7, generator=g)
    odd[4:] = torch.randn(2, VOCAB, generator=g) - 3
    odd[4:, :15] = 5.0
    odd[4:, 100:300] = 4.0 + 0.01 * torch.rand(2, 200, generator=g)
    p = params(6, temperature=[1.0, 0.8, 1.0, 0.0, 1.0, 0.7], top_k=[0, 30, 0, 0, 10, 0], top_p=[0.9] * 6)
    good &= compare("ties and -inf", odd, p, num_top=20, paths=[1, 1, 1, 0, 1, 1], gather=[0, 0, 1, 1, 0, 0])
    counts = list_counts()
    good &= check(
        "a -inf floor lists the finite scores, and no raw logit",
        counts[2:4] == [[7, sampling_triton.RAW_LISTED + 1]] * 2,
        f"{counts[2:4]}",
    )  # fmt: skip
    # Every logit equal: every token reaches the floor. A list past its end takes no more tokens.
    equal = torch.zeros(2, VOCAB)
    p2 = params(2, temperature=[1.0, 1.0], top_p=[0.9, 1.0], slots=[0, 0])
    good &= compare("equal logits", equal, p2, num_top=20, paths=[ANY | {1}] * 2, gather=[1, 1])
    counts = list_counts()
    bound = sampling_triton.LISTED + -(-VOCAB // CHUNK) * BLOCK  # a block's worth per program, once full
    good &= check("full lists stop growing", max(max(c) for c in counts) <= bound, f"{counts} > {bound}")
    # A top-k past a cut's candidates (5 high tokens, then 300 tied a little below): top-p's share
    # of the top-k mass, which here keeps tied tokens too, is bounded by the row's total mass.
    tied = torch.randn(4, VOCAB, generator=g)
    tied[:, :5] = torch.tensor([5.5, 5.45, 5.4, 5.35, 5.3])
    tied[:, 100:400] = 5.0
    p3 = params(4, temperature=[1.0] * 4, top_k=[100, 100, 3, 0], top_p=[0.9, 0.5, 0.9, 0.9], slots=[0] * 4)
    with short_lists():
        good &= compare("top-k past a cut", tied, p3)
    with short_lists():
        # +4: the top-20 logprobs took the slow path; the last row's nucleus also reaches into the 200.
        paths = [1, 1, 1, 0, 5, {6, 7}]
        good &= compare("ties and -inf, cut", odd, p, num_top=20, paths=paths, gather=[1] * 6)
    # Flat rows: top-p alone keeps thousands of tokens, top-k 600 with top-p needs the top-k mass
    # first; min_p 0.5 keeps hundreds, 0.95 a few, and plain temperature all: its draw is the whole
    # row's argmax. Top-k 250 of 1200 flat tokens: from the list when it holds 250 tokens, else a
    # whole-row draw, out 4 times in 5.
    flat = torch.randn(9, VOCAB, generator=g) * 0.1
    p = params(9, temperature=[1.0] * 9, top_p=[0.95, 0.3, 0.9, 1.0, 1.0, 1.0, 1.0, 0.5, 1.0],
               top_k=[0, 0, 600, 0, 0, 0, 250, 250, 250], min_p=[0.0, 0.0, 0.0, 0.5, 0.95, 0.0, 0.0, 0.0, 0.0])  # fmt: skip
    paths = [ANY, ANY, ANY, 2, 1, 2, ANY | {1}, ANY | {1}, ANY | {1}]
    good &= compare("flat rows", flat, p, paths=paths, gather=[0] * 9)
    # Peaked rows whose few high tokens sit in one chunk: the other chunks' gather pass reads nothing.
    peak = torch.randn(3, VOCAB, generator=g) - 20
    peak[:, 300:303] = torch.tensor([10.0, 9.5, 9.0])
    p = params(3, temperature=[1.0, 0.7, 0.0], top_p=[0.9, 1.0, 1.0], slots=[0, 0, 0])
    good &= compare("peaked rows", peak, p, paths=[1, ANY, 0], gather=[0] * 3)
    with short_lists():
        good &= compare("peaked rows, one busy chunk", peak, p, paths=[1, ANY, 0], gather=[1] * 3)
    good &= check("both whole-row paths ran", {2, 3} <= SEEN_PATHS, f"paths seen: {sorted(SEEN_PATHS)}")
    good &= check("both ways to gather ran", sorted(SEEN_GATHERS) == [0, 1], f"seen: {sorted(SEEN_GATHERS)}")
    good &= check(
        "ranks came from the list and not", sorted(LISTED_RANKS) == [False, True], f"seen: {LISTED_RANKS}"
    )
    return good


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
