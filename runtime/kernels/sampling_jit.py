"""The sampling kernels' shared pieces: the order of floats as integers, the fixed-point mass, the
counter-based noise (bit for bit the definition's `uniform_noise`), and a row's penalized scores."""

from __future__ import annotations

import triton
import triton.language as tl

from .sampling import BIAS_BIT, COUNT_MASK, PROMPT_BIT, STOP_BIT

_COUNT = tl.constexpr(COUNT_MASK)
_PROMPT = tl.constexpr(PROMPT_BIT)
_STOP = tl.constexpr(STOP_BIT)
_BIAS = tl.constexpr(BIAS_BIT)


@triton.jit
def float_key(v):
    """fp32 -> uint64 in [0, 2**32) in the float order (-0.0 and 0.0 equal)."""
    b = v.to(tl.int32, bitcast=True).to(tl.int64)
    k = tl.where(b < 0, ~b, b + 2147483648)
    k = tl.where(k == 2147483647, 2147483648, k)
    return k.to(tl.uint64)


@triton.jit
def signed_key(v):
    """fp32 -> int32 in the float order: float_key(v) - 2**31, in 32-bit arithmetic."""
    b = v.to(tl.int32, bitcast=True)
    k = b ^ ((b >> 31) & 0x7FFFFFFF)
    return tl.where(k == -1, 0, k)


@triton.jit
def distance(top, k):
    """top - k of two signed keys, top >= k: a distance in the float order, as uint32."""
    return top.to(tl.uint32, bitcast=True) - k.to(tl.uint32, bitcast=True)


@triton.jit
def key_float(k):
    b = tl.where(k >= 2147483648, k - 2147483648, ~k & 0xFFFFFFFF).to(tl.int64)
    return b.to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def order_key(key, cols):
    """(score desc, index asc) as one uint64: larger comes first."""
    return (key << 32) | (4294967295 - cols.to(tl.uint64))


@triton.jit
def bucket(d):
    """A distance in the float order (uint32) -> [0, 240): exact below 16, then 8 per octave."""
    hi = (d.to(tl.float64).to(tl.int64, bitcast=True) >> 32).to(tl.int32)
    e = ((hi >> 20) & 2047) - 1023
    m = (hi >> 17) & 7
    return tl.where(d < 16, d.to(tl.int32), 16 + (e - 4) * 8 + m)


@triton.jit
def bucket_floor(top, cut):
    """The least signed key whose distance below `top` (a signed key) falls in a bucket <= cut >= 0:
    `bucket(distance(top, k)) <= cut` is `k >= bucket_floor(top, cut)`, one compare per logit."""
    c = tl.maximum(cut, 0).to(tl.int64)
    e = (c - 16) // 8 + 4
    m = (c - 16) % 8
    # The largest distance in bucket c: exact buckets hold one; bucket (e, m) ends before 2**e * (1 + (m + 1) / 8).
    wide = tl.where(c >= 239, 4294967295, (tl.full([], 1, tl.int64) << e) + ((m + 1) << (e - 3)) - 1)
    d = tl.where(c < 16, c, wide)
    return (tl.maximum(top.to(tl.int64) + 2147483648 - d, 0) - 2147483648).to(tl.int32)


@triton.jit
def fixed_mass_float(s, top):
    """floor(exp(s - top) * 2**32): an integer up to 2**32, exact as a float32."""
    return tl.where(s > float("-inf"), tl.floor(tl.exp(s - top) * 4294967296.0), 0.0)


@triton.jit
def fixed_mass(s, top):
    return fixed_mass_float(s, top).to(tl.int64)


@triton.jit
def uniform(seed, counter, cols):
    x = seed.to(tl.uint64, bitcast=True) * 0x9E3779B97F4A7C15 + counter.to(tl.uint64, bitcast=True)
    x = x * 0x9E3779B97F4A7C15 + cols.to(tl.uint64)
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    x = x ^ (x >> 31)
    # 23 bits, so u < 1 in float32 (sampling.py's uniform_noise says why).
    return (((x >> 41) & 0x7FFFFF).to(tl.float32) + 0.5) * (1.0 / 8388608.0)


@triton.jit
def gumbel(seed, counter, cols):
    return -tl.log(-tl.log(uniform(seed, counter, cols)))


# A row's selection state (sampling_triton's `sel`): 0 cut, 1 candidates kept, 2 top-k logprobs' cut,
# 3 their candidates, 4 members of the bucket after that cut, 5 the path (`sample`'s `paths`),
# 6 whether gather_kernel passed over the row (its lists did not hold the candidates).
SEL_FIELDS = 8
SEL = tl.constexpr(SEL_FIELDS)

# A row's parameters: SamplingTensors' fields, in its order; float ones hold float32 bits.
NFIELDS = 12
NF = tl.constexpr(NFIELDS)
RANKS_FIELD = 11  # "ranks": the row asked for logprobs, so its token's rank is counted
RANKS = tl.constexpr(RANKS_FIELD)


@triton.jit
def float_field(prow, field):
    return tl.load(prow + field).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def int_field(prow, field):
    return tl.load(prow + field)


@triton.jit
def row_terms(p_ptr):
    """A row's scoring terms (SamplingTensors' layout): 1 / temperature, the three penalties, its
    penalty-table slot, and whether stop tokens are banned (min_tokens). The row-parallel passes
    load them once: inside a loop that also stores, the compiler reloads them (they may alias)."""
    temp = float_field(p_ptr, 0)
    inv_t = tl.math.div_rn(1.0, tl.where(temp > 0, temp, 1.0))
    ban = int_field(p_ptr, 8) < int_field(p_ptr, 10)
    return (
        inv_t,
        float_field(p_ptr, 3),
        float_field(p_ptr, 4),
        float_field(p_ptr, 5),
        int_field(p_ptr, 9),
        ban,
    )


@triton.jit
def scores(row, cols, V, logits_ptr, stride_l, p_ptr, ent_ptr, stride_e, bits_ptr, stride_b):
    """(in bounds, raw fp32 logits, penalized scores over the temperature) of one row's `cols`.

    `p_ptr` points at the row's parameters (SamplingTensors' layout: `float_field`, `int_field`).
    """
    inv_t, rep, pres, freq, slot, ban = row_terms(p_ptr)
    return scores_of(
        row, cols, V, logits_ptr, stride_l, inv_t, rep, pres, freq, slot, ban, ent_ptr, stride_e, bits_ptr, stride_b,
    )  # fmt: skip


@triton.jit
def scores_of(
    row, cols, V, logits_ptr, stride_l, inv_t, rep, pres, freq, slot, ban, ent_ptr, stride_e, bits_ptr, stride_b,
):  # fmt: skip
    """`scores` with the row's terms already loaded (`row_terms`)."""
    inb = cols < V
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_l + cols, mask=inb, other=float("-inf")).to(tl.float32)
    word = tl.load(bits_ptr + slot * stride_b + (cols >> 5), mask=inb, other=0)
    hit = ((word >> (cols & 31)) & 1) != 0
    # A row's penalties touch the few tokens its table holds: most blocks skip their arithmetic (the
    # exact division above all). Unpenalized, x - f * 0 - p * 0 is x but for the sign of a zero,
    # which no key, mass or draw sees.
    if tl.max(hit.to(tl.int32), 0) > 0:
        row_e = ent_ptr + slot * stride_e
        e = tl.load(row_e + cols, mask=inb & hit, other=0)
        # The bias first (vLLM's order), from the second half of the slot's row.
        biased = (e & _BIAS) != 0
        b = tl.load(row_e + (stride_e >> 1) + cols, mask=inb & biased, other=0).to(tl.float32, bitcast=True)
        pen = tl.where(biased, x + b, x)
        count = e & _COUNT
        seen = (e & (_COUNT | _PROMPT)) != 0
        pen = tl.where(seen, tl.where(pen > 0, tl.math.div_rn(pen, rep), pen * rep), pen)
        pen = pen - freq * count.to(tl.float32)
        pen = pen - pres * (count > 0).to(tl.float32)
        pen = tl.where(ban, tl.where((e & _STOP) != 0, float("-inf"), pen), pen)
        s = pen * inv_t
    else:
        s = x * inv_t
    return inb, x, tl.where(inb, s, float("-inf"))
