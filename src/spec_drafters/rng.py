"""One rule for derived seeds: every random stream of a run (a step's draws, one sequence's row of the
global batch, an epoch's order, a prompt's sampled answer) is seeded from the run's seed and the
stream's index, so a resumed, re-sharded or reordered run draws what the uninterrupted one did."""


def derived_seed(seed: int, index: int) -> int:
    """The seed of stream ``index`` of a run seeded ``seed`` (a prime stride keeps the streams of
    nearby seeds apart: seed 1's stream 0 is not seed 0's stream 1)."""
    return seed * 1_000_003 + index
