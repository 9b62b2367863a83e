"""``serve-eval``: a drafter measured inside vLLM, by vLLM's own counters (docs/serving.md).

    spec-drafters serve-eval --config CONFIG [--model.init_from FOLDER | --ckpt_path CKPT]
        [--humaneval N | --prompts FILE] [--max_tokens 64] [--verifier TARGET_FOLDER] --out DIR

The drafter of the config (as ``generate`` builds it) is exported in the speculators layout with its
verifier (artefacts/verifier.py), read by vLLM's config code first (cli/vllm_probe.py), then the same
token-id prompts go, greedily, through two vLLM servers started here one after the other: the target
alone, and the target with the drafter as its speculative config. Reported: the engine's spec-decode
counters (mean acceptance length = 1 + accepted / drafts, per-position acceptance, drafted and
accepted tokens), tokens/s of each server, whether every speculative output equals the plain one, and
beside them this project's own chain decoder on the same prompts (its tau and whether its outputs equal
the engine's) and, when given, the offline val tau of a ``validate --results`` file.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from spec_drafters.cli.checks import out_folder
from spec_drafters.errors import InputError

ROOT = Path(__file__).resolve().parents[3]
PROBE = Path(__file__).with_name("vllm_probe.py")
#: The spec-decode counters vLLM exports at /metrics (vllm/v1/spec_decode/metrics.py).
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def vllm_python() -> str | None:
    """The Python of vLLM's environment: $SPEC_DRAFTERS_VLLM_PYTHON, else ``.vllm-venv`` (``make
    vllm``) in the working folder or the repository."""
    chosen = os.environ.get("SPEC_DRAFTERS_VLLM_PYTHON")
    if chosen:
        return chosen if Path(chosen).is_file() else None
    for root in (Path.cwd(), ROOT):
        python = root / ".vllm-venv" / "bin" / "python"
        if python.is_file():
            return str(python)
    return None


def serve_eval_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="spec-drafters serve-eval",
        description="The config's drafter served by vLLM as the target's speculative config: the engine's "
        "acceptance counters and speed with and without it, its outputs checked against the engine's "
        "plain greedy ones, next to this project's own decoder (docs/serving.md). Other arguments "
        "(--config, --ckpt_path, --model.*) are LightningCLI's, as for generate.",
        allow_abbrev=False,
    )
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--humaneval", type=int, metavar="N", help="N HumanEval problems, evenly spaced")
    src.add_argument("--prompts", help="a JSONL file of records with a 'prompt' (or 'text') field")
    ap.add_argument("--max_tokens", type=int, default=64, help="new tokens per prompt at most")
    ap.add_argument("--out", required=True, help="folder for the export, the server logs and serve_eval.json")
    ap.add_argument("--verifier", help="the target's model folder (default: the embedded target's)")
    ap.add_argument(
        "--folder",
        help="serve this drafter folder as it is written (someone's export, a hand-edited one) instead of "
        "exporting the config's drafter; our own decoder still decodes the config's drafter",
    )
    ap.add_argument("--vllm_python", help="vLLM's Python (default: $SPEC_DRAFTERS_VLLM_PYTHON or .vllm-venv)")
    ap.add_argument("--port", type=int, default=8021)
    ap.add_argument("--concurrency", type=int, default=1, help="requests in flight (1: one stream, latency)")
    ap.add_argument(
        "--server_args",
        default="--dtype float32 --enforce-eager --max-model-len 2048",
        help="more vLLM server arguments (on a GPU e.g. '--dtype bfloat16 --tensor-parallel-size 2')",
    )
    ap.add_argument("--val_results", help="a validate --results JSON of this drafter: its val/tau is shown")
    ap.add_argument("--no_own", action="store_true", help="skip this project's own decoder")
    return ap


def serve_eval(argv: list[str]) -> None:
    from spec_drafters.artefacts.folders import layout_files, write_files
    from spec_drafters.cli.generate import prompt_texts
    from spec_drafters.cli.setup_args import load_setup
    from spec_drafters.cli.tools import export_verifier

    args, rest = serve_eval_parser().parse_known_args(argv)
    if args.max_tokens < 1 or args.concurrency < 1:
        raise InputError("--max_tokens and --concurrency must be >= 1")
    python = args.vllm_python or vllm_python()
    if python is None or not Path(python).is_file():
        raise InputError("vLLM's environment not found: `make vllm` builds .vllm-venv (or --vllm_python)")
    out = out_folder(Path(args.out))
    out.mkdir(parents=True, exist_ok=True)  # the logs go there also when --folder is served as is
    texts = prompt_texts(args.humaneval, args.prompts)
    setup = load_setup(rest)
    folder = setup.folder()
    verifier = export_verifier(folder, args.verifier)
    if verifier is None:
        raise InputError("serve-eval: name the target's model folder with --verifier")
    served = Path(args.folder) if args.folder else out / "drafter"
    if not args.folder:
        write_files(served, *layout_files(folder, "speculators", verifier), "speculators")
    probe = run_probe(python, served, out)
    print(f"vLLM reads {served} as {json.dumps(probe['speculative_config'])}: {probe['dflash_config']}")
    prompts = [setup.tokenizer.encode(t) for t in texts]
    runs = {}
    for name, speculative in (("plain", None), ("dflash", probe["speculative_config"])):
        with VllmServer(python, str(verifier.folder), args, out / f"vllm-{name}.log", speculative) as server:
            runs[name] = server.run(prompts, setup, args)
    own = None if args.no_own else own_decoder(setup, prompts, args.max_tokens)
    report = summary(runs, own, probe, args, len(prompts), setup.card.name)
    (out / "serve_eval.json").write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    print(json.dumps(report["summary"]))


def run_probe(python: str, drafter: Path, out: Path) -> dict:
    """cli/vllm_probe.py in vLLM's environment: what vLLM's config code makes of the export."""
    env = {**os.environ, "VLLM_CACHE_ROOT": str(out / "vllm-cache")}
    run = subprocess.run([python, str(PROBE), str(drafter)], capture_output=True, text=True, env=env)
    if run.returncode != 0:
        raise InputError(f"vLLM's config code refuses {drafter}:\n{run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


class VllmServer:
    """vLLM's OpenAI-compatible server for the duration of a ``with`` block, logging to ``log``."""

    def __init__(self, python: str, model: str, args, log: Path, speculative: dict | None = None):
        self.base = f"http://localhost:{args.port}"
        self.log = log
        self.command = [
            python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--served-model-name", "target", "--port", str(args.port), "--seed", "0",
            "--max-num-seqs", str(args.concurrency), *shlex.split(args.server_args),
        ]  # fmt: skip
        if speculative is not None:
            self.command += ["--speculative-config", json.dumps(speculative)]
        cache = log.parent / "vllm-cache"
        # CPU settings (ignored on a GPU): its KV cache in GiB, one OpenMP thread bound to core 0.
        self.env = {
            "VLLM_CACHE_ROOT": str(cache), "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "0", **os.environ,
        }  # fmt: skip

    def __enter__(self) -> VllmServer:
        print(f"+ {shlex.join(self.command)}")
        self.file = self.log.open("w")
        self.process = subprocess.Popen(
            self.command, stdout=self.file, stderr=subprocess.STDOUT, env=self.env
        )
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log.read_text()[-3000:]
                code = self.process.returncode
                raise InputError(f"the vLLM server stopped (exit {code}); {self.log}:\n{tail}")
            try:
                urllib.request.urlopen(self.base + "/v1/models", timeout=5).read()
                return self
            except OSError:
                time.sleep(3)
        self.__exit__(None, None, None)
        raise InputError(f"the vLLM server did not answer within 900 s ({self.log})")

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.file.close()

    def counters(self) -> dict:
        """vLLM's spec-decode counters now, summed over engines (0 where it exports none)."""
        text = urllib.request.urlopen(self.base + "/metrics", timeout=30).read().decode()
        return parse_counters(text)

    def run(self, prompts: list[list[int]], setup, args) -> dict:
        from spec_drafters.decode.engines import OpenAICompatible, Settings

        engine = OpenAICompatible(self.base, model="target", concurrency=args.concurrency, retries=0)
        engine.start(setup.target, setup.tokenizer, setup.card)  # serves this target's tokenizer?
        before = self.counters()
        start = time.perf_counter()
        item_ids = [f"{i:012x}" for i in range(len(prompts))]
        answers = engine.generate(prompts, item_ids, Settings(args.max_tokens))
        seconds = time.perf_counter() - start
        after = self.counters()
        delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        outputs = [ids for ids, _ in answers]
        return {"outputs": outputs, "seconds": seconds, "tokens": sum(map(len, outputs)), "counters": delta}


def parse_counters(text: str) -> dict:
    """``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens`` and ``accepted_at_<position>``
    from Prometheus text, each summed over its label sets (engines)."""
    out: dict = {}
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:spec_decode_"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name = name_labels.split("{", 1)[0].removeprefix("vllm:spec_decode_").removesuffix("_total")
        if name == "num_accepted_tokens_per_pos":
            pos = int(name_labels.split('position="', 1)[1].split('"', 1)[0])
            per_pos[pos] = per_pos.get(pos, 0.0) + float(value)
        elif name in COUNTERS:
            out[name] = out.get(name, 0.0) + float(value)
    for pos, value in per_pos.items():
        out[f"accepted_at_{pos}"] = value
    return out


def own_decoder(setup, prompts: list[list[int]], max_tokens: int) -> dict:
    """This project's greedy chain with the same drafter on the same prompts (decode/generate.py). Its
    speed is not reported: another process, other kernels, not the engine's."""
    from spec_drafters.decode.verifiers import GreedyChain

    chain = GreedyChain()
    outputs, lengths = [], []
    for i, prompt in enumerate(prompts):
        result = setup.speculate(prompt, max_tokens, chain)
        outputs.append(result.tokens)
        lengths += result.accept_lengths
        print(f"[own {i}] {len(result.tokens)} tokens, tau {result.tau:.2f}", file=sys.stderr)
    return {"outputs": outputs, "accept_lengths": lengths}


def summary(served: dict, own: dict | None, probe: dict, args, n: int, target: str) -> dict:
    plain, spec = served["plain"], served["dflash"]
    c = spec["counters"]
    drafts = c.get("num_drafts", 0.0)
    k = probe["speculative_config"]["num_speculative_tokens"]
    same = sum(a == b for a, b in zip(spec["outputs"], plain["outputs"], strict=True))
    row = {
        "target": target,
        "drafter": args.folder or "the config's, exported",
        "prompts": n,
        "max_tokens": args.max_tokens,
        "concurrency": args.concurrency,
        "speculative_tokens": k,
        "engine_mean_acceptance_length": 1 + c.get("num_accepted_tokens", 0.0) / max(drafts, 1),
        "engine_per_position": [c.get(f"accepted_at_{i}", 0.0) / max(drafts, 1) for i in range(k)],
        "engine_drafts": drafts,
        "engine_draft_tokens": c.get("num_draft_tokens", 0.0),
        "engine_accepted_tokens": c.get("num_accepted_tokens", 0.0),
        "engine_tokens_per_s_plain": plain["tokens"] / plain["seconds"],
        "engine_tokens_per_s_dflash": spec["tokens"] / spec["seconds"],
        "engine_speedup": (spec["tokens"] / spec["seconds"]) / (plain["tokens"] / plain["seconds"]),
        "identical_to_plain": f"{same}/{n}",
    }
    if own is not None:
        lengths = own["accept_lengths"]  # tokens a round commits: accepted drafts + the target's own
        row["own_tau"] = sum(lengths) / len(lengths)
        row["own_per_position"] = [sum(a - 1 > i for a in lengths) / len(lengths) for i in range(k)]
        same_own = sum(a == b for a, b in zip(own["outputs"], plain["outputs"], strict=True))
        row["own_identical_to_engine_plain"] = f"{same_own}/{n}"
    if args.val_results:
        row["val_tau"] = json.loads(Path(args.val_results).read_text())["metrics"].get("val/tau")
    return {
        "summary": row,
        "probe": probe,
        "outputs": {"plain": plain["outputs"], "dflash": spec["outputs"], "own": own and own["outputs"]},
    }


def table(report: dict) -> str:
    s = report["summary"]
    lists = ("engine_per_position", "own_per_position")
    lines = [f"{key:34s} {value}" for key, value in s.items() if key not in lists]
    for key in lists:
        if key in s:
            lines.append(f"{key:34s} " + ", ".join(f"{p:.3f}" for p in s[key]))
    return "\n".join(lines)
