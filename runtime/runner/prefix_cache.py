"""Automatic prefix caching: KV blocks found again by the tokens they hold.

A full block of a prefilled sequence is remembered under a key: its tokens, and the block before it
(its id and that block's generation, bumped whenever the block is handed out for other tokens). So a
key names one exact prefix, with no hash to collide, and a block's key goes stale the moment its
predecessor is reused. A request whose prompt starts with remembered blocks shares them (a
reference count per block) and prefills only the rest.

Blocks nobody holds but that are remembered stay in the cache, idle, until an allocation needs them:
free blocks go first, then the idle ones, least recently released first (a sequence's tail before
its head, so a shared prefix outlives the blocks after it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from .kv_cache import BlockAllocator, CacheFullError

ROOT = (0, 0)  # the "block before" the first block (block 0 is never handed out)


def root_for(adapter: int, salt: str | None = None) -> tuple[int | str, int]:
    """The first block's "block before" for sequences run with the engine's LoRA adapter number
    `adapter` (0: none; engine/lora_slots.py) and the prompt's cache_salt: the same tokens under
    another adapter hold other KV, and under another salt belong to another tenant, so they are
    never found across either. (A salt is a string: no block number equals it.)"""
    if salt is not None:
        return (salt, -adapter)
    return (0, -adapter) if adapter else ROOT


class PrefixCachingAllocator(BlockAllocator):
    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks)
        self.block_size = block_size
        self._refs = [0] * num_blocks
        self._generation = [0] * num_blocks
        self._key_of: dict[int, tuple] = {}
        self._block_of: dict[tuple, int] = {}
        self._idle: OrderedDict[int, None] = OrderedDict()  # remembered, held by nobody; LRU first
        self.queried_tokens = 0  # prompt tokens looked up, and those found (vLLM's hit rate)
        self.hit_tokens = 0

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._idle)

    @property
    def num_remembered(self) -> int:
        return len(self._key_of)

    def allocate(self, n: int) -> list[int]:
        if n > self.num_free:
            raise CacheFullError(f"need {n} KV blocks, {self.num_free} free")
        out = []
        for _ in range(n):
            if self._free:
                block = self._free.popleft()
            else:
                block, _ = self._idle.popitem(last=False)
                self._forget(block)
            self._refs[block] = 1
            out.append(block)
        return out

    def free(self, blocks: list[int]) -> None:
        for block in reversed(blocks):  # the tail goes idle first, so it is evicted first
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if block in self._key_of:
                    self._idle[block] = None
                else:
                    self._free.append(block)

    def reset(self) -> int:
        """Forget every remembered block (vLLM's reset_prefix_cache); how many. Idle ones become free;
        held ones stay with their sequences, never found again."""
        forgotten = list(self._key_of)
        for block in forgotten:
            self._forget(block)
        self._free.extend(self._idle)
        self._idle.clear()
        return len(forgotten)

    def _forget(self, block: int) -> None:
        del self._block_of[self._key_of.pop(block)]
        self._generation[block] += 1  # keys that name this block as their predecessor go stale

    def _key(self, parent: tuple[int | str, int], tokens: Sequence[int], i: int) -> tuple:
        bs = self.block_size
        return (*parent, tuple(tokens[i * bs : (i + 1) * bs]))

    def match(self, tokens: Sequence[int], max_blocks: int, root: tuple[int | str, int] = ROOT) -> list[int]:
        """The remembered blocks that hold `tokens`' first whole blocks (at most `max_blocks`), each
        now held once more by the caller; `root`: root_for the sequence's adapter."""
        found: list[int] = []
        parent = root
        for i in range(max_blocks):
            block = self._block_of.get(self._key(parent, tokens, i))
            if block is None:
                break
            found.append(block)
            parent = (block, self._generation[block])
        for block in found:
            if self._refs[block] == 0:
                del self._idle[block]
            self._refs[block] += 1
        return found

    def remember(self, table: list[int], tokens: Sequence[int], full: int, walk: Walk) -> Walk:
        """Remember blocks `walk.blocks` to `full` of a sequence's `table`, which hold `tokens`; the
        walk to resume from next time.

        A block whose prefix another block already holds is not remembered, and its successors
        chain from that one instead: either serves a later request the same KV."""
        parent = walk.parent
        for i in range(walk.blocks, full):
            key = self._key(parent, tokens, i)
            block = self._block_of.get(key)
            if block is None:
                block = table[i]
                if block in self._key_of:  # remembered under another prefix (never expected): stop
                    return Walk(i, parent)
                self._key_of[block] = key
                self._block_of[key] = block
            parent = (block, self._generation[block])
        return Walk(max(full, walk.blocks), parent)


@dataclass(frozen=True, slots=True)
class Walk:
    """How far a sequence's blocks are remembered: `blocks` of them, the last one's key part `parent`."""

    blocks: int = 0
    parent: tuple[int | str, int] = ROOT
