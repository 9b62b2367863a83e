"""Drafter training step (forward + backward) per attention backend over N, K, S, with peak memory,
as ratios to the dense SDPA baseline; the chunked vocabulary loss; the peer (speculators) side by side.

A drafter shaped like the embedded target's (hidden 576, 9/3 heads, head dim 64, SwiGLU 1536; one
layer) on random context features, the DFlash mask of N blocks of K over S context positions. Each
measurement runs in a fresh process, so its peak resident memory (ru_maxrss, minus the memory held
before the first step) is its own. Dense kernels whose mask and scores would not fit are skipped with
the memory they would need. Run: ``python benchmarks/training_step.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
from pathlib import Path

import torch

from common import record, timed

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEER_PY = ROOT / ".peer-venv" / "bin" / "python"
H, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, TAPS = 576, 9, 3, 64, 1536, 49152, 5
MEMORY_LIMIT_GIB = 14.0  # of this machine's 24: an eager run predicted above it is skipped
MAX_DENSE_PAIRS = 4e8  # dense kernels above this many (query, key) pairs take minutes a step on 2 cores


class _Smol:  # the embedded target's shape, without loading it
    hidden_size, num_attention_heads, num_key_value_heads, head_dim = H, HEADS, KV_HEADS, HEAD_DIM
    intermediate_size, rope_theta = INTER, 100000.0


def rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def dense_gib(n: int, k: int, s: int) -> float:
    """What a dense kernel holds at least: fp32 scores and probabilities over S + N*K keys per head."""
    q, keys = n * k, s + n * k
    return (2 * HEADS * q * keys * 4 + q * keys) / 2**30


def attention_step(backend: str, n: int, k: int, s: int, repeats: int) -> dict:
    from spec_drafters.model.blocks import build_blocks
    from spec_drafters.model.drafter import DFlashDrafter, DrafterConfig
    from spec_drafters.model.masks import training_layout
    from spec_drafters.train.anchors import UniformAnchors

    cfg = DrafterConfig(num_layers=1, block_size=k, attention=backend).resolved(_Smol, TAPS, mask_token_id=16)
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg)
    g = torch.Generator().manual_seed(0)
    taps = torch.randn((1, s, TAPS * H), generator=g)
    ids = torch.randint(0, 1000, (1, s), generator=g)
    anchors, ok = UniformAnchors(n)(torch.ones((1, s), dtype=torch.long), k, g)
    _, pos = build_blocks(ids, anchors, k, 16)
    embeds = torch.randn((1, n * k, H), generator=g)

    def run():
        layout = training_layout(anchors, ok, s, k)  # built per step, as training does
        drafter.zero_grad(set_to_none=True)
        out = drafter(embeds, pos, masks=[layout], taps=taps)
        out.square().mean().backward()

    before = rss_mib()
    step = timed(run, repeats)
    return {"step_s": step, "peak_mib": peak_mib() - before, "valid_anchors": int(ok.sum())}


def full_step(backend: str, n: int, k: int, s: int, repeats: int, train: bool = True) -> dict:
    """Our whole step as the module runs it: drafter, frozen tied head on the supervised slots only,
    hard CE with slot weights, backward (``train=False``: forward and loss under no_grad)."""
    from spec_drafters.model.blocks import build_blocks
    from spec_drafters.model.drafter import DFlashDrafter, DrafterConfig
    from spec_drafters.model.masks import training_layout
    from spec_drafters.train.anchors import UniformAnchors
    from spec_drafters.train.losses import HardCE, SlotBatch

    cfg = DrafterConfig(num_layers=1, block_size=k, attention=backend).resolved(_Smol, TAPS, mask_token_id=16)
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg)
    g = torch.Generator().manual_seed(0)
    embedding = torch.randn((VOCAB, H), generator=g) * 0.02  # tied embedding / head, frozen
    taps = torch.randn((1, s, TAPS * H), generator=g)
    ids = torch.randint(0, VOCAB, (1, s), generator=g)
    anchors, ok = UniformAnchors(n)(torch.ones((1, s), dtype=torch.long), k, g)
    block_ids, pos = build_blocks(ids, anchors, k, 16)
    sup = ok[:, :, None].expand(1, n, k).clone()
    sup[:, :, 0] = False  # slot 0 is the anchor
    sup &= (anchors[:, :, None] + torch.arange(k)) < s
    labels = torch.randint(0, VOCAB, (1, n, k), generator=g)
    slots = torch.arange(k).expand(1, n, k)
    loss = HardCE(gamma=7.0)

    def run():
        layout = training_layout(anchors, ok, s, k)
        drafter.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(train):
            hidden = drafter(embedding[block_ids], pos, masks=[layout], taps=taps).view(1, n, k, H)
            batch = SlotBatch(hidden[sup], labels[sup], slots[sup], sup, head=lambda x: x @ embedding.T)
            out = loss(batch)["loss"]
        if train:
            out.backward()

    before = rss_mib()
    step = timed(run, repeats)
    return {"step_s": step, "peak_mib": peak_mib() - before, "supervised_rows": int(sup.sum())}


def loss_step(chunk: int | None, m: int, repeats: int) -> dict:
    from spec_drafters.train.losses import HardCE, SlotBatch

    g = torch.Generator().manual_seed(0)
    head = torch.randn((VOCAB, H), generator=g) * 0.02
    hidden = torch.randn((m, H), generator=g, requires_grad=True)
    labels = torch.randint(0, VOCAB, (m,), generator=g)
    slots = torch.arange(m) % 15 + 1
    sup = torch.ones((1, m, 1), dtype=torch.bool)
    loss = HardCE()

    def run():
        batch = SlotBatch(hidden, labels, slots, sup, head=lambda x: x @ head.T, chunk_rows=chunk)
        hidden.grad = None
        loss(batch)["loss"].backward()

    before = rss_mib()
    step = timed(run, repeats)
    return {"step_s": step, "peak_mib": peak_mib() - before}


def in_fresh_process(spec: dict) -> dict:
    cmd = [sys.executable, __file__, "--one", json.dumps(spec)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def peer_step(n: int, k: int, s: int, repeats: int) -> dict:
    """The speculators DFlash training step at the same shape, in its own venv (benchmarks/peer_setup.sh)."""
    if not PEER_PY.exists():  # the peer's own virtual environment, never a dependency of ours
        setup = subprocess.run(["bash", str(HERE / "peer_setup.sh")], capture_output=True, text=True)
        if setup.returncode != 0 or not PEER_PY.exists():
            last = (setup.stderr.strip().splitlines() or ["?"])[-1]
            return {"error": f"benchmarks/peer_setup.sh failed: {last}"}
    cmd = [str(PEER_PY), str(HERE / "peer_speculators.py"), "--hidden", str(H), "--heads", str(HEADS),
           "--kv-heads", str(KV_HEADS), "--head-dim", str(HEAD_DIM), "--intermediate", str(INTER),
           "--layers", "1", "--vocab", str(VOCAB), "--num-target-layers", "30", "--N", str(n), "--K", str(k),
           "--S", str(s), "--repeats", str(repeats)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    return json.loads(lines[-1])


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares exponent b of y = a * x^b."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum((a - mx) ** 2 for a in lx)


def cells(*values, width: int = 9) -> str:
    """One table line: numbers to 3 decimals (or whole when large), every cell right-aligned."""

    def one(v):
        if isinstance(v, float):
            return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3f}"
        return "-" if v is None else str(v)

    return " ".join(one(v).rjust(width) for v in values)


def attention_grid(sizes: tuple, repeats: int) -> list[dict]:
    rows = []
    print(cells("N", "K", "S", "backend", "step s", "peak MiB", "t/sdpa", "mem/sdpa"))
    for s in sizes[2]:
        for k in sizes[1]:
            for n in sizes[0]:
                if n > s // 2:
                    continue  # not N distinct anchors in S positions with room for their blocks
                base = None
                for backend in ("sdpa", "eager", "split"):
                    row = {"N": n, "K": k, "S": s, "backend": backend}
                    row["pairs_allowed"], row["pairs_dense"] = n * k * (s + k), n * k * (s + n * k)
                    need = dense_gib(n, k, s)
                    if backend == "eager" and need > MEMORY_LIMIT_GIB:
                        row["skipped"] = f"needs >= {need:.0f} GiB for dense scores"
                    elif backend != "split" and row["pairs_dense"] > MAX_DENSE_PAIRS:
                        row["skipped"] = f"{row['pairs_dense']:.1e} dense pairs: minutes per step here"
                    else:
                        spec = {"kind": "attention", "backend": backend, "N": n, "K": k, "S": s}
                        row.update(in_fresh_process({**spec, "repeats": repeats}))
                    if backend == "sdpa" and "step_s" in row:
                        base = row
                    if base is not None and "step_s" in row:
                        row["time_ratio_to_sdpa"] = row["step_s"] / base["step_s"]
                        row["mem_ratio_to_sdpa"] = row["peak_mib"] / max(base["peak_mib"], 1e-9)
                    rows.append(row)
                    if "step_s" in row:
                        ratios = [row.get("time_ratio_to_sdpa"), row.get("mem_ratio_to_sdpa")]
                        print(cells(n, k, s, backend, row["step_s"], row["peak_mib"], *ratios))
                    else:
                        print(cells(n, k, s, backend), " ", row.get("skipped") or row.get("error"))
    return rows


def growth_law(rows: list[dict]) -> dict:
    growth = {}
    for backend, pairs in (("split", "pairs_allowed"), ("sdpa", "pairs_dense"), ("eager", "pairs_dense")):
        done = [r for r in rows if r["backend"] == backend and "step_s" in r]
        if len(done) >= 3:
            xs = [r[pairs] for r in done]
            growth[backend] = {
                "vs": pairs,
                "time_exponent": round(slope(xs, [r["step_s"] for r in done]), 3),
                "memory_exponent": round(slope(xs, [max(r["peak_mib"], 1.0) for r in done]), 3),
            }
            g = growth[backend]
            print(f"growth {backend}: step time ~ {pairs}^{g['time_exponent']:.2f}, "
                  f"peak memory ~ {pairs}^{g['memory_exponent']:.2f}")  # fmt: skip
    return growth


def loss_table(sizes: list[int], repeats: int) -> list[dict]:
    rows = []
    print(f"\nhard CE over V = {VOCAB} for M supervised slots, whole vs in chunks of 1024 rows")
    print(cells("M rows", "chunk", "step s", "peak MiB"))
    for m in sizes:
        for chunk in (None, 1024):
            row = {"M": m, "chunk_rows": chunk}
            row.update(in_fresh_process({"kind": "loss", "chunk": chunk, "M": m, "repeats": repeats}))
            rows.append(row)
            print(cells(m, chunk, row.get("step_s"), row.get("peak_mib")))
    return rows


def peer_table(shapes: list[tuple], backend: str, repeats: int) -> list[dict]:
    """Our whole step (drafter + head + loss) and speculators' at the same shapes. speculators' default
    attention (flex) cannot train on CPU, so it is compared forward-only with ours forward-only, and
    its dense ``sdpa`` option, which trains, is compared with our training step."""
    out = []
    print(f"\nour whole training step ({backend} attention) vs speculators' DFlash step, same shapes")
    print(
        cells(
            "N",
            "K",
            "S",
            "peer attn",
            "mode",
            "ours s",
            "peer s",
            "peer/ours",
            "ours MiB",
            "peer MiB",
            "mem ratio",
        )
    )
    for n, k, s in shapes:
        peer = peer_step(n, k, s, repeats)
        runs = [peer] + ([peer["alt"]] if isinstance(peer.get("alt"), dict) else [])
        for p in runs:
            mode = p.get("mode") or "failed"
            spec = {"kind": "full", "backend": backend, "N": n, "K": k, "S": s, "repeats": repeats}
            ours = in_fresh_process({**spec, "train": mode == "train"}) if mode != "failed" else {}
            row = {"N": n, "K": k, "S": s, "peer_attention": p.get("attention"), "mode": mode,
                   "ours_step_s": ours.get("step_s"), "ours_peak_mib": ours.get("peak_mib"),
                   "peer_step_s": p.get("step_s"), "peer_rss_increase_mib": p.get("rss_increase_mib"),
                   "peer_error": p.get("error"), "peer_version": p.get("version")}  # fmt: skip
            if row["peer_step_s"] and row["ours_step_s"]:
                row["time_ratio_peer_to_ours"] = row["peer_step_s"] / row["ours_step_s"]
            if row["peer_rss_increase_mib"] and row["ours_peak_mib"]:
                row["mem_ratio_peer_to_ours"] = row["peer_rss_increase_mib"] / max(row["ours_peak_mib"], 1e-9)
            out.append(row)
            values = [row["ours_step_s"], row["peer_step_s"], row.get("time_ratio_peer_to_ours")]
            values += [row["ours_peak_mib"], row["peer_rss_increase_mib"], row.get("mem_ratio_peer_to_ours")]
            print(cells(n, k, s, p.get("attention"), mode, *values))
            if p.get("error"):
                print(f"    peer error: {p['error'][:300]}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="the smallest sizes only (a smoke run)")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--peer-only", action="store_true", help="only our whole step beside speculators'")
    parser.add_argument("--backend", default="split", help="our attention for the comparison with the peer")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    if args.one:
        spec = json.loads(args.one)
        if spec["kind"] == "attention":
            out = attention_step(spec["backend"], spec["N"], spec["K"], spec["S"], spec["repeats"])
        elif spec["kind"] == "full":
            out = full_step(spec["backend"], spec["N"], spec["K"], spec["S"], spec["repeats"], spec["train"])
        else:
            out = loss_step(spec["chunk"], spec["M"], spec["repeats"])
        print(json.dumps(out))
        return
    sizes = ([64], [16], [512]) if args.quick else ([64, 256, 1024], [16, 32], [512, 2048])
    rows = [] if args.peer_only else attention_grid(sizes, args.repeats)
    growth = growth_law(rows) if rows else {}
    loss_rows = (
        [] if args.peer_only else loss_table([1024] if args.quick else [1024, 4096, 16384], args.repeats)
    )
    shapes = [(64, 16, 512)] if args.quick else [(64, 16, 512), (256, 16, 2048)]
    peer_rows = [] if args.no_peer else peer_table(shapes, args.backend, args.repeats)

    def key(r):
        return f"N{r['N']}_K{r['K']}_S{r['S']}"

    split = [r for r in rows if r["backend"] == "split" and "time_ratio_to_sdpa" in r]
    summary = {
        "benchmark": "training_step",
        "split_time_ratio_to_sdpa": {key(r): round(r["time_ratio_to_sdpa"], 3) for r in split},
        "split_mem_ratio_to_sdpa": {key(r): round(r["mem_ratio_to_sdpa"], 3) for r in split},
        "split_step_s": {
            key(r): round(r["step_s"], 3) for r in rows if r["backend"] == "split" and "step_s" in r
        },
        "growth": growth,
        "loss_peak_mib": {
            f"M{r['M']}_chunk{r['chunk_rows']}": round(r.get("peak_mib", -1)) for r in loss_rows
        },
        "peer": [
            {
                k: r.get(k)
                for k in (
                    "N",
                    "K",
                    "S",
                    "peer_attention",
                    "mode",
                    "time_ratio_peer_to_ours",
                    "mem_ratio_peer_to_ours",
                )
            }
            for r in peer_rows
        ],
    }
    everything = rows + [{"loss": r} for r in loss_rows] + [{"peer": r} for r in peer_rows]
    record("training_step", everything, summary)


if __name__ == "__main__":
    main()
