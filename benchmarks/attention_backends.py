"""Drafter training step (forward + backward) per attention kernel, as a ratio to eager.

A drafter shaped like the quickstart one (hidden 576, 9/3 heads, 2 layers) on random context features;
the dense DFlash mask over [S context | N*K block tokens]. Run: ``python benchmarks/attention_backends.py``.
"""

from __future__ import annotations

import argparse

import torch

from common import record, timed
from spec_drafters.anchors import UniformAnchors, build_blocks
from spec_drafters.drafter import DFlashDrafter, DrafterConfig
from spec_drafters.masks import training_mask
from spec_drafters.registry import entries, load_components


class _Smol:  # the embedded target's shape, without loading it
    hidden_size, num_attention_heads, num_key_value_heads, head_dim = 576, 9, 3, 64
    intermediate_size, rope_theta = 1536, 100000.0


def step_fn(attention: str, seq: int, anchors: int, block: int):
    cfg = DrafterConfig(num_layers=2, block_size=block, attention=attention).resolved(
        _Smol, 5, mask_token_id=16
    )
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg)
    g = torch.Generator().manual_seed(0)
    taps = torch.randn((1, seq, 5 * 576), generator=g)
    ids = torch.randint(0, 1000, (1, seq), generator=g)
    a, ok = UniformAnchors(anchors)(torch.ones((1, seq), dtype=torch.long), block, g)
    _, pos = build_blocks(ids, a, block, 16)
    embeds = torch.randn((1, anchors * block, 576), generator=g)
    mask = training_mask(a, ok, seq, block)

    def run():
        out = drafter(embeds, pos, drafter.encode_context(taps, torch.arange(seq)[None]), [mask] * 2)
        out.square().mean().backward()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    load_components()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    kernels = [e.name for e in entries("attention")]
    rows = []
    for seq, anchors, block in [(256, 16, 8), (512, 64, 8), (512, 32, 16)]:
        base = None
        for kernel in kernels:
            t = timed(step_fn(kernel, seq, anchors, block), args.repeats)
            base = t if kernel == "eager" else base
            rows.append(
                {
                    "S": seq,
                    "N": anchors,
                    "K": block,
                    "kernel": kernel,
                    "step_s": t,
                    "ratio_to_eager": t / base,
                }
            )
    print(f"{'S':>5} {'N':>4} {'K':>3} {'kernel':>8} {'step ms':>9} {'vs eager':>9}")
    for r in rows:
        shape = f"{r['S']:>5} {r['N']:>4} {r['K']:>3} {r['kernel']:>8}"
        print(f"{shape} {1e3 * r['step_s']:>9.1f} {r['ratio_to_eager']:>9.2f}")
    sdpa = [r["ratio_to_eager"] for r in rows if r["kernel"] == "sdpa"]
    record(
        "attention_backends",
        rows,
        {"benchmark": "attention_backends", "sdpa_vs_eager_mean": sum(sdpa) / len(sdpa)},
    )


if __name__ == "__main__":
    main()
