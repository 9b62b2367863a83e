"""Decoding-run folders (benchmarks/humaneval_decoding.py): real decoding of a drafter on HumanEval in
resumable pieces, each piece one ``spec-drafters validate`` process over a slice of the prompts.

A folder is one drafter under one setting: its identity (the weights' sha256, the configs and their
parsed content, the decoding settings) is the folder's ``identity.json`` (studies/stages.py: pieces of
another drafter or setting are refused, never merged); each finished piece is a kept stage
(``part-XX-of-PP.json``: the piece's validate results) beside its per-prompt rows
(``part-XX-of-PP.jsonl``, what the tables are computed from). ``DECODERS`` names the row keys'
suffixes.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from spec_drafters.cli.tools import flag_value
from spec_drafters.decode.summary import summarize
from spec_drafters.files import sha256_file, write_json
from spec_drafters.lightning.callbacks import PROMPT_LOOKUP_IMPL
from spec_drafters.studies.results import CHECKOUT
from spec_drafters.studies.stages import IDENTITY, Stages, stage_record

# keys of an identity that older folders did not record: their absence is not a difference
OPTIONAL_IDENTITY = frozenset({"config_content"})

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
    cfg = yaml.safe_load((CHECKOUT / "configs" / "bench_humaneval.yaml").read_text())
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


def piece_name(part: int, parts: int) -> str:
    return f"part-{part:02d}-of-{parts:02d}"


def part_command(args, folder: Path, config: Path, part: int) -> tuple[list[str], Path]:
    """The validate command of one piece, and where its validate results land (its rows go beside, in
    ``.jsonl``)."""
    rows = folder / f"{piece_name(part, args.parts)}.jsonl"
    cmd = [sys.executable, "-m", "spec_drafters.cli.main", "validate"]
    cmd += [a for c in args.config for a in ("--config", c)] + args.extra
    results = rows.with_suffix(".validate.json")
    cmd += ["--config", str(config), "--results", str(results)]
    cmd += ["--trainer.callbacks.prompts.init_args.num_prompts", str(args.num_prompts)]
    cmd += ["--trainer.callbacks.prompts.init_args.part", str(part)]
    cmd += ["--trainer.callbacks.prompts.init_args.parts", str(args.parts)]
    cmd += ["--trainer.callbacks.output", str(rows)]
    if args.ckpt_path:
        cmd += ["--ckpt_path", args.ckpt_path]
    if args.init_from:
        cmd += ["--model.init_from", args.init_from]
    return cmd, results


def run_pieces(args, folder: Path, stages: Stages, config: Path) -> None:
    """Runs the pieces not kept yet, ``args.workers`` at a time (each with cores // workers threads);
    a piece is kept (its validate results) only once its process has finished."""
    threads = str(max(1, (os.cpu_count() or 1) // args.workers))
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}

    def piece(part: int) -> dict:
        name = piece_name(part, args.parts)
        cmd, results = part_command(args, folder, config, part)
        print(f"piece {part + 1}/{args.parts}: started", flush=True)
        with open(folder / f"{name}.log", "w") as log:
            done = subprocess.run(cmd, cwd=CHECKOUT, env=env, stdout=log, stderr=log)
        if done.returncode != 0:
            raise SystemExit(f"piece {part + 1} failed (exit {done.returncode}): see {name}.log in {folder}")
        print(f"piece {part + 1}/{args.parts}: done", flush=True)
        result = json.loads(results.read_text())
        results.unlink()  # kept in the stage's file
        return result

    parts = {piece_name(p, args.parts): p for p in range(args.parts)}
    with ThreadPoolExecutor(args.workers) as pool:
        list(pool.map(lambda name: stages.run(name, lambda: piece(parts[name])), stages.missing(list(parts))))


def _config_init_from(configs: list[str]) -> str | None:
    value = None
    for c in configs:  # later configs override earlier ones, as in validate
        model = (yaml.safe_load((CHECKOUT / c).read_text()) or {}).get("model") or {}  # validate runs there
        value = model.get("init_from", value)
    return value


def config_content(config: str) -> str:
    """A short hash of a config file's parsed content without ``trainer.callbacks``: the benchmark's
    overlay replaces that list (the demo's own decoding callback is not what the pieces measured)."""
    cfg = yaml.safe_load((CHECKOUT / config).read_text()) or {}
    if isinstance(cfg.get("trainer"), dict):
        cfg["trainer"].pop("callbacks", None)
        if not cfg["trainer"]:
            del cfg["trainer"]
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]


def drafter_identity(args) -> dict:
    """What the pieces under one name must share: the drafter's weights (sha256) and the settings."""
    weights = Path(args.ckpt_path) if args.ckpt_path else None
    folder = args.init_from or flag_value(args.extra, "--model.init_from") or _config_init_from(args.config)
    if weights is None and folder is not None:
        weights = CHECKOUT / folder / "model.safetensors"
    digest = sha256_file(weights) if weights is not None and weights.is_file() else None
    return {
        "weights": os.path.relpath(weights, CHECKOUT) if weights else None,
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
        "prompt_lookup_impl": PROMPT_LOOKUP_IMPL,
    }


def prompt_lookup_impl(prompt_rows: list[dict]) -> str | None:
    """Which prompt lookup the rows timed (None: none ran): the callback marks its rows; rows with
    prompt lookup and no mark timed transformers' ``generate``."""
    if "tau_prompt_lookup" not in prompt_rows[0]:
        return None
    return "+".join(sorted({r.get("prompt_lookup_impl", "transformers") for r in prompt_rows}))


def open_folder(args, folder: Path) -> Stages:
    """The folder's kept pieces; refused when it holds pieces of another drafter or setting."""
    upgrade_legacy_folder(folder)
    return Stages(folder, drafter_identity(args), optional=OPTIONAL_IDENTITY)


def upgrade_legacy_folder(folder: Path) -> bool:
    """A folder written before the stage scheme (``drafter.json``, each piece's validate results as
    ``part-XX-of-PP.json``) in today's layout: the identity renamed, each piece's results wrapped as a
    kept stage (commit, command and time not recorded then: null). True when it upgraded one."""
    legacy = folder / "drafter.json"
    if not legacy.is_file() or (folder / IDENTITY).is_file():
        return False
    for part in sorted(folder.glob("part-*-of-*.json")):
        old = json.loads(part.read_text())
        if "result" not in old:
            write_json(part, stage_record(old))
    os.replace(legacy, folder / IDENTITY)
    return True


def folder_rows(folder: Path) -> list[dict]:
    """The prompt rows of a finished folder (every piece must be there), piece by piece."""
    identity = json.loads((folder / IDENTITY).read_text())
    return merged_rows(folder, identity["parts"], identity["num_prompts"])


def merged_rows(folder: Path, parts: int, num_prompts: int) -> list[dict]:
    """Every piece's prompt rows, piece by piece, each with its ``piece`` (a row's ``prompt`` counts
    within its piece)."""
    out = []
    for part in range(parts):
        rows = folder / f"{piece_name(part, parts)}.jsonl"
        if not rows.is_file() or not rows.with_suffix(".json").is_file():  # rows of a piece not kept
            raise SystemExit(
                f"{folder}: piece {part + 1} of {parts} is missing ({rows.name}); finish it first"
            )
        out += [{**json.loads(line), "piece": part} for line in rows.read_text().splitlines() if line.strip()]
    if len(out) != num_prompts:
        raise SystemExit(f"{folder}: {len(out)} prompt rows for {num_prompts} prompts")
    return out


def summaries(prompt_rows: list[dict]) -> list[dict]:
    """One summary per decoder over all prompts (decode/summary.py's rule)."""
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
