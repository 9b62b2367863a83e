"""Real decoding on HumanEval: plain greedy, the chain, DDTree at B = 8/16/32/64 and prompt lookup, one run.

Runs ``spec-drafters validate`` with ``configs/bench_humaneval.yaml`` over a drafter's config (all 164
prompts x 64 new tokens by default, batch size 1), then prints per decoder: tau as the mean of
per-prompt means and pooled, tokens/s, speedup over plain greedy decoding measured in the same run,
and how many outputs equal plain greedy's token for token. Prompt lookup runs on the same target path
as greedy and the drafters (decode/generate.py ``prompt_lookup_generate``: transformers' candidate
rule, our forward, cache and counting); its rows say ``prompt_lookup_impl: fast_path``, and the
results line says which prompt lookup its rows timed (``transformers``: rows from before issue 30,
timed through transformers' ``generate`` on stock kernels).

The prompts run in ``--parts`` pieces, each its own process writing its per-prompt rows
(``<out>/<name>/part-XX-of-PP.jsonl``, by default under ``benchmarks/results/humaneval_decoding/``,
committed; with another ``--out`` the results line goes to ``<out>/humaneval_decoding.jsonl``, not
to the committed ``benchmarks/results/``): run the same command again, on this machine or a fresh
clone, and only the missing pieces run (a single process over all 164 prompts takes hours on 2 CPU
cores, more than one session here).
``<out>/<name>/drafter.json`` holds the sha256 of the drafter the pieces measured (the folder's
weights or the checkpoint) and the command's decoding settings; a rerun with another drafter or other
settings under the same name is refused rather than merged. ``--workers 2`` runs two pieces
at a time, one thread each: every prompt's speedup is its own decoders against its own greedy run,
timed back to back in one process, so the summary compares like with like. With ``--cost_model``
the adaptive-budget DDTree (``adaptive_ddtree``, max budget 64) decodes too; with ``--chain_depth D
...`` chains that verify only their first D drafts (``GreedyChain(max_depth=D)``).

    python benchmarks/humaneval_decoding.py --config configs/quickstart.yaml \\
        --ckpt_path runs/quickstart/checkpoints/last.ckpt [--num_prompts 164] [--name demo]
    python benchmarks/humaneval_decoding.py --config configs/reference_smollm2.yaml \\
        --config configs/reference_eval.yaml --name reference --workers 2 --cost_model runs/cost.json

Arguments it does not know (``--model.*``, ``--data.*``) are passed on to ``spec-drafters validate``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import RESULTS, record
from spec_drafters.cli.tools import flag_value

ROOT = Path(__file__).resolve().parent.parent
OUT = RESULTS / "humaneval_decoding"  # the committed pieces
DECODERS = {
    "": "chain",
    "_ddtree_b8": "ddtree B=8",
    "_ddtree_b16": "ddtree B=16",
    "_ddtree_b32": "ddtree B=32",
    "_ddtree_b64": "ddtree B=64",
    "_adaptive_ddtree_b64": "adaptive B<=64",
    "_lookup_hybrid_greedy_chain": "chain + lookup",
    "_lookup_hybrid_ddtree_b8": "ddtree B=8 + lookup",
    "_lookup_hybrid_adaptive_ddtree_b64": "adaptive + lookup",
    "_prompt_lookup": "prompt lookup",
}
KEYS = ("new_tokens", "rounds", "committed", "tau", "seconds", "tokens_per_s", "speedup", "lossless")
GREEDY = ("greedy_tokens", "greedy_seconds", "greedy_tokens_per_s")


def overlay(
    folder: Path,
    cost_model: str | None,
    chain_depths: list[int] | None = None,
    lookup: bool = False,
    budgets: list[int] | None = None,
) -> Path:
    """configs/bench_humaneval.yaml (its DDTrees only at ``budgets`` when given: a B = 64 tree alone
    takes twice plain greedy's time here), plus the adaptive verifier when a cost model is given, the
    chains cut at ``chain_depths``, and with ``lookup`` the chain, DDTree B = 8 and the adaptive tree
    each with a branch copied from the context (``LookupHybrid``, as many tokens as prompt lookup)."""
    import yaml

    cfg = yaml.safe_load((ROOT / "configs" / "bench_humaneval.yaml").read_text())
    if budgets:
        callback = cfg["trainer"]["callbacks"][0]["init_args"]
        known = {v["init_args"]["budget"] for v in callback["verifiers"] if v["class_path"] == "DDTree"}
        if set(budgets) - known:
            unknown = sorted(set(budgets) - known)
            raise SystemExit(f"--budgets {unknown}: the benchmark's DDTree budgets are {sorted(known)}")
        callback["verifiers"] = [
            v
            for v in callback["verifiers"]
            if v["class_path"] != "DDTree" or v["init_args"]["budget"] in budgets
        ]
    if cost_model:
        callback = cfg["trainer"]["callbacks"][0]["init_args"]
        callback["verifiers"].append(
            {"class_path": "AdaptiveDDTree", "init_args": {"cost_model": str(Path(cost_model).resolve())}}
        )
    for depth in chain_depths or []:
        verifier = {"class_path": "GreedyChain", "init_args": {"max_depth": depth}}
        cfg["trainer"]["callbacks"][0]["init_args"]["verifiers"].append(verifier)
    if lookup:
        callback = cfg["trainer"]["callbacks"][0]["init_args"]
        inner = [{"class_path": "GreedyChain"}, {"class_path": "DDTree", "init_args": {"budget": 8}}]
        inner += [v for v in callback["verifiers"] if v["class_path"] == "AdaptiveDDTree"]
        for v in inner:
            hybrid = {"verifier": v, "length": callback["prompt_lookup_tokens"]}
            callback["verifiers"].append({"class_path": "LookupHybrid", "init_args": hybrid})
    path = folder / "overlay.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def part_command(args, folder: Path, config: Path, part: int) -> tuple[list[str], Path]:
    rows = folder / f"part-{part:02d}-of-{args.parts:02d}.jsonl"
    cmd = [sys.executable, "-m", "spec_drafters.cli.main", "validate"]
    cmd += [a for c in args.config for a in ("--config", c)] + args.extra
    cmd += ["--config", str(config), "--results", str(rows.with_suffix(".json"))]
    cmd += ["--trainer.callbacks.prompts.init_args.num_prompts", str(args.num_prompts)]
    cmd += ["--trainer.callbacks.prompts.init_args.part", str(part)]
    cmd += ["--trainer.callbacks.prompts.init_args.parts", str(args.parts)]
    cmd += ["--trainer.callbacks.output", str(rows)]
    if args.ckpt_path:
        cmd += ["--ckpt_path", args.ckpt_path]
    if args.init_from:
        cmd += ["--model.init_from", args.init_from]
    return cmd, rows


def _config_init_from(configs: list[str]) -> str | None:
    import yaml

    value = None
    for c in configs:  # later configs override earlier ones, as in validate
        model = (yaml.safe_load((ROOT / c).read_text()) or {}).get("model") or {}  # validate runs in ROOT
        value = model.get("init_from", value)
    return value


def config_content(config: str) -> str:
    """A short hash of a config file's parsed content without ``trainer.callbacks``: the benchmark's
    overlay replaces that list (the demo's own decoding callback is not what the pieces measured)."""
    import hashlib

    import yaml

    cfg = yaml.safe_load((ROOT / config).read_text()) or {}
    if isinstance(cfg.get("trainer"), dict):
        cfg["trainer"].pop("callbacks", None)
        if not cfg["trainer"]:
            del cfg["trainer"]
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]


def drafter_identity(args) -> dict:
    """What the pieces under one name must share: the drafter's weights (sha256) and the settings."""
    import hashlib

    weights = Path(args.ckpt_path) if args.ckpt_path else None
    folder = args.init_from or flag_value(args.extra, "--model.init_from") or _config_init_from(args.config)
    if weights is None and folder is not None:
        weights = ROOT / folder / "model.safetensors"
    digest = None
    if weights is not None and weights.is_file():
        h = hashlib.sha256()
        with open(weights, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        digest = h.hexdigest()
    return {
        "weights": os.path.relpath(weights, ROOT) if weights else None,
        "sha256": digest,
        "config": args.config,
        # what the files say too: an overlay edited between sessions (another target setting, another
        # data file) must not merge into the pieces measured with the old one
        "config_content": [config_content(c) for c in args.config],
        "extra": args.extra,
        "num_prompts": args.num_prompts,
        "parts": args.parts,
        "cost_model": bool(args.cost_model),
        **({"chain_depths": args.chain_depth} if args.chain_depth else {}),  # absent in older folders
        **({"lookup": True} if args.lookup else {}),
        **({"budgets": sorted(args.budgets)} if args.budgets else {}),
        # pieces that timed transformers' prompt lookup (folders without this key) are not merged
        "prompt_lookup_impl": _impl(),
    }


def _impl() -> str:
    from spec_drafters.lightning.callbacks import PROMPT_LOOKUP_IMPL

    return PROMPT_LOOKUP_IMPL


def prompt_lookup_impl(prompt_rows: list[dict]) -> str | None:
    """Which prompt lookup the rows timed (None: none ran): the callback marks its rows; rows with
    prompt lookup and no mark timed transformers' ``generate``."""
    if "tau_prompt_lookup" not in prompt_rows[0]:
        return None
    return "+".join(sorted({r.get("prompt_lookup_impl", "transformers") for r in prompt_rows}))


def check_identity(args, folder: Path) -> None:
    """Refuses to add pieces measured with another drafter or settings to a name's folder."""
    mine = drafter_identity(args)
    file = folder / "drafter.json"
    if file.is_file():
        theirs = json.loads(file.read_text())
        older = {"config_content"} - set(theirs)  # folders written before it was recorded
        diff = sorted(k for k in mine if k not in older and theirs.get(k) != mine[k])
        if diff:
            raise SystemExit(
                f"{folder} holds pieces of another run (differs in {', '.join(diff)}): "
                "use another --name, or delete the folder to measure again"
            )
    else:
        file.write_text(json.dumps(mine, indent=1) + "\n")


def run_parts(args, folder: Path, config: Path) -> None:
    """Runs the missing parts, ``args.workers`` at a time (each with cores // workers threads)."""
    todo = []
    for part in range(args.parts):
        cmd, rows = part_command(args, folder, config, part)
        if not rows.is_file():
            todo.append((part, cmd))
    threads = str(max(1, (os.cpu_count() or 1) // args.workers))
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    running: list[tuple[int, subprocess.Popen]] = []
    while todo or running:
        while todo and len(running) < args.workers:
            part, cmd = todo.pop(0)
            log = open(folder / f"part-{part:02d}-of-{args.parts:02d}.log", "w")  # noqa: SIM115
            print(f"part {part + 1}/{args.parts}: started", flush=True)
            running.append((part, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log)))
        time.sleep(2)
        for part, proc in list(running):
            if proc.poll() is not None:
                running.remove((part, proc))
                if proc.returncode != 0:
                    raise SystemExit(f"part {part} failed (exit {proc.returncode}): see its .log in {folder}")
                print(f"part {part + 1}/{args.parts}: done", flush=True)


def merged_rows(args, folder: Path) -> list[dict]:
    """Every piece's prompt rows, piece by piece, each with its ``piece`` (a row's ``prompt`` counts
    within its piece)."""
    out = []
    for part in range(args.parts):
        rows = folder / f"part-{part:02d}-of-{args.parts:02d}.jsonl"
        if not rows.is_file():
            raise SystemExit(
                f"{folder}: piece {part + 1} of {args.parts} is missing ({rows.name}); finish it first"
            )
        out += [{**json.loads(line), "piece": part} for line in rows.read_text().splitlines() if line.strip()]
    if len(out) != args.num_prompts:
        raise SystemExit(f"{folder}: {len(out)} prompt rows for {args.num_prompts} prompts")
    return out


def summaries(prompt_rows: list[dict]) -> list[dict]:
    """One summary per decoder over all prompts (decode/summary.py's rule)."""
    from spec_drafters.decode.summary import summarize

    out = []
    depths = sorted(int(k.rsplit("_d", 1)[1]) for k in prompt_rows[0] if k.startswith("tau_greedy_chain_d"))
    decoders = {**DECODERS, **{f"_greedy_chain_d{d}": f"chain D={d}" for d in depths}}
    for suffix, label in decoders.items():
        if f"tau{suffix}" not in prompt_rows[0]:
            continue
        per = [{**{k: r[k] for k in GREEDY}, **{k: r[f"{k}{suffix}"] for k in KEYS}} for r in prompt_rows]
        s = summarize(per)
        out.append(
            {
                "decoder": label,
                "tau": s["tau"],
                "tau_pooled": s["tau_pooled"],
                "tokens_per_s": s["tokens_per_s"],
                "speedup": s["speedup"],
                "lossless": round(s["lossless"] * s["prompts"]),
                "greedy_tokens_per_s": s["greedy_tokens_per_s"],
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, action="append", help="the drafter's config (repeatable)")
    ap.add_argument("--ckpt_path", help="a Lightning checkpoint of that config")
    ap.add_argument("--init_from", help="or a drafter folder (e.g. registry/drafters/...)")
    ap.add_argument("--num_prompts", type=int, default=164)
    ap.add_argument("--parts", type=int, default=8, help="pieces the prompts run in (resumable)")
    ap.add_argument("--workers", type=int, default=1, help="pieces running at a time")
    ap.add_argument("--cost_model", help="a spec-drafters cost-model JSON: adds the adaptive DDTree")
    ap.add_argument("--chain_depth", type=int, nargs="+", help="adds chains verifying only D drafts")
    ap.add_argument("--budgets", type=int, nargs="+", help="only these of the DDTree budgets 8 16 32 64")
    ap.add_argument(
        "--lookup", action="store_true", help="adds the chain, DDTree B=8 (and adaptive) with context drafts"
    )
    ap.add_argument("--name", default="drafter", help="a label for the results line")
    ap.add_argument("--out", default=str(OUT), help="the pieces' folder; elsewhere, the results line too")
    args, args.extra = ap.parse_known_args()  # the rest (--model.*, --data.*) goes to validate
    folder = Path(args.out) / args.name
    folder.mkdir(parents=True, exist_ok=True)
    check_identity(args, folder)
    run_parts(args, folder, overlay(folder, args.cost_model, args.chain_depth, args.lookup, args.budgets))
    prompt_rows = merged_rows(args, folder)
    rows = summaries(prompt_rows)
    impl = prompt_lookup_impl(prompt_rows)
    prompts = args.num_prompts
    greedy = sum(r["greedy_tokens_per_s"] for r in rows) / len(rows)  # the same greedy runs for all
    print(f"{prompts} HumanEval prompts; plain greedy {greedy:.2f} tokens/s")
    print(f"{'decoder':<15} {'tau':>6} {'pooled':>7} {'tok/s':>7} {'speedup':>8} {'lossless':>9}")
    for r in rows:
        print(
            f"{r['decoder']:<15} {r['tau']:>6.3f} {r['tau_pooled']:>7.3f} {r['tokens_per_s']:>7.2f} "
            f"{r['speedup']:>7.2f}x {r['lossless']:>5}/{prompts}"
        )
    if impl:
        print(f"prompt lookup: {impl}")
    best = max(rows, key=lambda r: r["speedup"])
    record(
        "humaneval_decoding",
        rows,
        {
            "name": args.name,
            "prompts": prompts,
            "parts": args.parts,
            "workers": args.workers,
            "greedy_tokens_per_s": greedy,
            "best": best["decoder"],
            "best_speedup": best["speedup"],
            "prompt_lookup_impl": impl,
        },
        # a check run with --out elsewhere keeps its line there, out of the committed results
        RESULTS if Path(args.out).resolve() == OUT.resolve() else Path(args.out),
    )


if __name__ == "__main__":
    main()
