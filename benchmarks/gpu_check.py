"""The GPU path in one command (`make gpu-check`, docs/scale.md#gpu): what a machine with a GPU runs in
a few minutes, and what this CPU runs of it. Ends with one JSON line, appended to
results/gpu_check.jsonl with the git SHA and the device.

1. The device: CUDA or not, its name, bf16, the installed GPU kernels (flash-attn, fla, causal-conv1d).
2. A few `fit` steps of the tiny hybrid target (Gated-DeltaNet + attention, tests/configs/tiny_hybrid.yaml)
   per drafter attention kernel: bf16-mixed on CUDA (sdpa, split, flex compiled), fp32 on a CPU
   (sdpa, split; flex has no CPU backward in torch 2.13). Each: exit status, finite loss, tokens/s,
   FLOP/s and, on CUDA, MFU (TrainingThroughput: the first step's FLOPs counted, Lightning's peaks).
3. Export of the first kernel's checkpoint in the speculators layout against the tiny target saved as a
   model folder (its head rows, the verifier block), read back, and read by vLLM's config code where
   vLLM's environment exists.
4. `serve-eval` of the shipped drafter on the embedded target (2 HumanEval prompts, 32 tokens) where
   vLLM's environment exists: the engine's acceptance and outputs against its plain greedy.

    python benchmarks/gpu_check.py [--out runs/gpu_check] [--steps 6]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch

from common import record

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))


def device_facts() -> dict:
    cuda = torch.cuda.is_available()
    kernels = {m: importlib.util.find_spec(m) is not None for m in ("flash_attn", "fla", "causal_conv1d")}
    return {
        "cuda": cuda,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "bf16": bool(cuda and torch.cuda.is_bf16_supported()),
        "gpu_kernels": kernels,
    }


def fit_steps(out: Path, kernel: str, steps: int, cuda: bool) -> dict:
    exe = str(Path(sys.executable).with_name("spec-drafters"))
    root = out / f"fit-{kernel}"
    cmd = [exe, "fit", "--config", "tests/configs/tiny_hybrid.yaml", "--trainer.max_steps", str(steps),
           "--model.drafter.attention", kernel, "--trainer.accelerator", "gpu" if cuda else "cpu",
           "--trainer.precision", "bf16-mixed" if cuda else "32-true",
           "--trainer.callbacks+=TrainingThroughput",
           "--trainer.default_root_dir", str(root), "--results", str(root / "fit.json")]  # fmt: skip
    start = time.perf_counter()
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    row = {"kernel": kernel, "rc": run.returncode, "seconds": round(seconds, 1)}
    if run.returncode != 0:
        return {**row, "error": run.stderr[-800:]}
    metrics = json.loads((root / "fit.json").read_text())["metrics"]
    loss = metrics.get("train/loss")
    return {
        **row,
        "loss": loss,
        "finite": loss is not None and math.isfinite(loss),
        "tokens_per_s": metrics.get("train/tokens_per_s"),
        "tflops_per_s": (metrics.get("train/flops_per_s") or 0) / 1e12,
        "mfu": metrics.get("train/mfu"),  # CUDA only: Lightning's table of peak FLOPs
        "ckpt": str(root / "checkpoints" / "last.ckpt"),
    }


def export_check(out: Path, ckpt: str, vllm: str | None) -> dict:
    from spec_drafters.artefacts.folders import read_folder
    from spec_drafters.cli.main import main as cli
    from spec_drafters.cli.serve_eval import run_probe
    from spec_drafters.errors import InputError
    from spec_drafters.target.loaders import TinyRandom

    target = out / "tiny-target"
    TinyRandom(architecture="qwen3_5", num_layers=8).load().model.save_pretrained(target)
    folder = out / "exported"
    layout = ["--layout", "speculators", "--verifier", str(target), "--force"]
    cli(["export", ckpt, "--out", str(folder), *layout])
    back = read_folder(folder, num_target_layers=8)
    row = {"export": "ok", "fc_ids": back.fc_ids}
    if vllm is not None:
        try:
            seen = run_probe(vllm, folder, out)
        except InputError:  # vLLM's config code refused the folder
            seen = {}
        row["vllm_reads"] = seen.get("dflash_config", {}).get("target_layer_ids") == back.fc_ids
    return row


def serve_check(out: Path, vllm: str | None, cuda: bool) -> dict:
    if vllm is None:
        return {"serve_eval": "skipped: no vLLM environment (make vllm, or SPEC_DRAFTERS_VLLM_PYTHON)"}
    exe = str(Path(sys.executable).with_name("spec-drafters"))
    dtype = "--dtype bfloat16" if cuda else "--dtype float32 --enforce-eager"
    cmd = [exe, "serve-eval", "--config", "configs/reference_smollm2.yaml", "--config",
           "configs/reference_eval.yaml", "--trainer.callbacks", "[]", "--humaneval", "2",
           "--max_tokens", "32", "--vllm_python", vllm, "--server_args", f"{dtype} --max-model-len 2048",
           "--out", str(out / "serve_eval"), "--port", "8041"]  # fmt: skip
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if run.returncode != 0:
        return {"serve_eval": "failed", "error": run.stderr[-800:]}
    s = json.loads((out / "serve_eval" / "serve_eval.json").read_text())["summary"]
    keep = ("engine_mean_acceptance_length", "own_tau", "identical_to_plain", "engine_speedup")
    return {"serve_eval": "ok", **{k: s[k] for k in keep}}


def main() -> None:
    from spec_drafters.cli.serve_eval import vllm_python

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/gpu_check")
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    facts = device_facts()
    cuda = facts["cuda"]
    kernels = ["sdpa", "split", "flex"] if cuda else ["sdpa", "split"]
    fits = [fit_steps(out, k, args.steps, cuda) for k in kernels]
    for row in fits:
        speed = row.get("tokens_per_s") or 0.0
        print(f"fit {row['kernel']:6s} rc {row['rc']} {speed:8.1f} tok/s, loss {row.get('loss')}")
    vllm = vllm_python()
    exported = export_check(out, fits[0]["ckpt"], vllm) if fits[0]["rc"] == 0 else {"export": "no checkpoint"}
    served = serve_check(out, vllm, cuda)
    ok = all(r["rc"] == 0 and r.get("finite") for r in fits) and exported.get("export") == "ok"
    ok = ok and exported.get("vllm_reads", True) and served["serve_eval"] != "failed"
    summary = {
        **facts,
        "ok": ok,
        "fits": [{k: v for k, v in r.items() if k != "ckpt"} for r in fits],
        **exported,
        **served,
        "seconds": round(time.perf_counter() - start, 1),
    }
    record("gpu_check", [], summary)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
