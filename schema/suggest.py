"""'Did you mean' for names a manifest got slightly wrong."""

import difflib
from collections.abc import Iterable


def did_you_mean(word: object, candidates: Iterable[str]) -> str:
    """`; did you mean 'x'?` for the closest candidate, or '' when none is close.

    Close means similar spelling, or the only candidate that starts with the word ('flex').
    """
    if not isinstance(word, str) or not word:
        return ""
    candidates = list(candidates)
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    if not close:
        close = [c for c in candidates if c.startswith(word)]
    return f"; did you mean {close[0]!r}?" if len(close) == 1 else ""
