"""Acceptance: the one tree walk every verifier and decoder uses (docs/method.md, DDTree).

From the root (the bonus token), follow the child whose token is the target's next token; stop when no
child has it. Teacher-forced, the target's next token at depth d is the label of slot d; in real
decoding it is the target's greedy token after the node, read from the verify forward. A chain is
the tree whose nodes each have one child, so the greedy chain's "longest matching prefix" is the
same walk.
"""

from __future__ import annotations

from collections.abc import Callable


def child_index(tokens: list[int], parents: list[int]) -> dict[int, dict[int, int]]:
    """parent -> {token: child}; of two children with the same token the first one counts."""
    children: dict[int, dict[int, int]] = {}
    for i, (t, p) in enumerate(zip(tokens, parents, strict=True)):
        children.setdefault(p, {}).setdefault(t, i)
    return children


def accepted_nodes(
    tokens: list[int], parents: list[int], next_token: Callable[[int, int], int | None]
) -> list[int]:
    """The accepted nodes, root's child first.

    ``tokens[i]``, ``parents[i]``: node i's token and parent (-1 for the root's children), parents
    before children. ``next_token(node, depth)`` is the target's token after ``node`` (-1 the root) at
    ``depth`` (0 at the root), or None where it is unknown (the walk stops there). Two children with
    the same token: the first one is followed.
    """
    children = child_index(tokens, parents)
    path: list[int] = []
    node = -1
    while (want := next_token(node, len(path))) is not None and (
        nxt := children.get(node, {}).get(want)
    ) is not None:
        path.append(nxt)
        node = nxt
    return path


def accepted_depth(tokens: list[int], parents: list[int], targets: list[int]) -> int:
    """Teacher-forced: how many drafts are accepted when the target's tokens by depth are ``targets``."""

    def label(_node: int, depth: int) -> int | None:
        return targets[depth] if depth < len(targets) else None

    return len(accepted_nodes(tokens, parents, label))
