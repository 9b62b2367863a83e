"""Training throughput from the offline cache vs online, and the step's FLOP/s against this machine's
matmul peak, all measured in one run.

The reference drafter's shape (configs/reference_smollm2.yaml: 3 layers, K 8, 48 anchors, 384 tokens,
batch 8) on the shipped corpus's first training records. Arms, each a full optimizer step (forward,
backward, AdamW) on the same batches:

- ``online``: the target runs over the batch every step (labels and features from it);
- ``offline``: the batch comes from a bf16 cache (features and hard labels stored);
- ``offline + V_d 8192``: the same with the draft vocabulary (head rows of the 8,192 most frequent
  labels of these records).

FLOPs of one offline step are counted with ``torch.utils.flop_counter.FlopCounterMode`` (matmuls and
attention, forward and backward); the peak is the median of fp32 1024^3 matmuls in the same process.

    python benchmarks/cache_throughput.py [--records 32] [--steps 3] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from common import record, timed

ROOT = Path(__file__).resolve().parent.parent


def matmul_peak(repeats: int) -> float:
    """The best FLOP/s of square fp32 matmuls of 512, 1024 and 2048 (what this machine's BLAS does on
    large products); measured before and after the arms, the higher is kept (the machine is shared)."""
    best = 0.0
    for n in (512, 1024, 2048):
        a, b = torch.randn(n, n), torch.randn(n, n)
        best = max(best, 2 * n**3 / timed(lambda a=a, b=b: a @ b, repeats, warmup=2))
    return best


def build(records: int, draft_vocab: Path | None):
    from spec_drafters.cli.setup_args import load_setup

    args = [
        "--config",
        str(ROOT / "configs" / "reference_smollm2.yaml"),
        "--data.path",
        str(ROOT / "data" / "stdlib_smollm2.jsonl.gz"),
        "--data.max_train_records",
        str(records),
        "--trainer.logger",
        "false",
    ]
    if draft_vocab is None:
        args += ["--model.draft_vocab", "FullVocab"]
    else:
        args += ["--model.draft_vocab.init_args.counts", str(draft_vocab)]
    module, data = load_setup(args, quiet=True, with_data=True)
    module.train()
    return module, data


def step_fn(module, batches, opt):
    state = {"i": 0}

    def step():
        batch = batches[state["i"] % len(batches)]
        state["i"] += 1
        loss = module.training_step(batch, 0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per arm (median)")
    ap.add_argument("--threads", type=int)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import logging

    logging.getLogger("lightning").setLevel(logging.ERROR)
    from spec_drafters.data.feature_cache import CachedRecords, build_cache, collate_cached
    from spec_drafters.data.records import collate
    from spec_drafters.model.vocab import count_labels

    tmp = Path(tempfile.mkdtemp(prefix="cache_throughput_"))
    module, data = build(args.records, None)
    module.log = lambda *a, **k: None  # no trainer: training_step's logging is a no-op here
    train, _ = data.examples(module.tokenizer)
    b = data.batch_size
    t0 = time.perf_counter()
    build_cache(module.feature_spec(), data, tmp / "cache", dtype="bfloat16", progress=False)
    cache_s = time.perf_counter() - t0
    cached = CachedRecords(tmp / "cache")
    online = [collate(train[i : i + b]) for i in range(0, len(train), b)]
    offline = [
        collate_cached([cached[j] for j in range(i, min(i + b, len(cached)))])
        for i in range(0, len(cached), b)
    ]
    tokens = sum(int(x["attention_mask"].sum()) for x in online) / len(online)  # per step
    counts = tmp / "counts.json"
    counts.write_text(json.dumps({"counts": dict(count_labels(cached[i] for i in range(len(cached))))}))
    vocab_module, _ = build(args.records, counts)
    vocab_module.log = lambda *a, **k: None
    vocab_module.drafter.load_state_dict(
        {**module.drafter.state_dict(), "draft_ids": vocab_module.drafter.draft_ids}
    )

    arms = {
        "online": (module, online),
        "offline": (module, offline),
        "offline_vd8192": (vocab_module, offline),
    }
    peak = matmul_peak(5)
    rows = []
    for name, (mod, batches) in arms.items():
        opt = torch.optim.AdamW([p for p in mod.parameters() if p.requires_grad], lr=1e-4)
        seconds = timed(step_fn(mod, batches, opt), args.steps, warmup=1)
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as counter:
            step_fn(mod, batches[:1], opt)()
        flops = counter.get_total_flops()
        rows.append(
            {
                "arm": name,
                "step_s": seconds,
                "tokens_per_s": tokens / seconds,
                "flops_per_step": flops,
                "flop_per_s": flops / seconds,
                "fraction_of_peak": flops / seconds / peak,
            }
        )
    peak = max(peak, matmul_peak(5))
    for r in rows:
        r["fraction_of_peak"] = r["flop_per_s"] / peak
    base = rows[0]["step_s"]
    print(
        f"batch {b} x ~{tokens / b:.0f} tokens, {args.records} records; cache build {cache_s:.0f} s "
        f"({tokens * len(online) / cache_s:.0f} tokens/s); matmul peak {peak / 1e9:.1f} GFLOP/s, "
        f"{torch.get_num_threads()} threads"
    )
    head = ("arm", "step s", "tokens/s", "vs online", "GFLOP/step", "GFLOP/s", "of peak")
    print(f"{head[0]:<16} " + " ".join(f"{h:>10}" for h in head[1:]))
    for r in rows:
        print(
            f"{r['arm']:<16} {r['step_s']:>10.2f} {r['tokens_per_s']:>10.0f} {base / r['step_s']:>9.2f}x "
            f"{r['flops_per_step'] / 1e9:>10.1f} {r['flop_per_s'] / 1e9:>10.1f} "
            f"{r['fraction_of_peak']:>10.2f}"
        )
    record(
        "cache_throughput",
        rows,
        {
            "offline_speedup": base / rows[1]["step_s"],
            "offline_vd_speedup": base / rows[2]["step_s"],
            "matmul_peak_gflops": peak / 1e9,
            "cache_build_s": cache_s,
            "threads": torch.get_num_threads(),
        },
    )


if __name__ == "__main__":
    main()
