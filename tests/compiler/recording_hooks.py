"""Event hooks that record what ran, for comparing a generated executor with the native one."""

LOG: list[str] = []


def after_warmup(executor) -> None:
    LOG.append(f"after_warmup guard={executor.in_warmup_guard}")


def before_overlap_loop(executor) -> None:
    LOG.append("before_overlap_loop")


def at_shutdown(executor) -> None:
    LOG.append(f"at_shutdown blocks_free={executor.allocator.num_free}")


class CountingPrologue:
    """A decode prologue that declines every call (so the native one runs) and counts them."""

    calls = 0

    def __call__(self, executor, inputs) -> bool:
        CountingPrologue.calls += 1
        LOG.append("prologue")
        return False


class ExplodingPrologue:
    """Declines during start-up, then fails on the first served step."""

    def __call__(self, executor, inputs) -> bool:
        if executor.in_warmup_guard:
            return False
        raise ValueError("planted prologue failure")


def exploding_event(executor) -> None:
    raise ValueError("planted event failure")
