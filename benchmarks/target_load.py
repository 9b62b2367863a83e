"""Host memory of each rank at start-up: the target loaded by every rank, or once per node
(``--model.load_target_once``), under FSDP2 with the target sharded, on 2 CPU processes over gloo
(configs/presets/fsdp2_cpu.yaml), in one run (issue 33; docs/scale.md#gpu).

The target is a mid-size random model (TinyRandom qwen3: 24 layers, hidden 1024, 16/8 heads, about
0.23B parameters, 0.84 GiB in fp32) so that its weights dominate a process's memory. Each run is a
`fit` of tests/configs/tiny.yaml with max_steps 0: the start-up only (target built, drafter built,
both sharded, the target's weights in place), which is what host memory holds on a GPU machine (there
training runs on the device; on this CPU the device is host memory too, so training steps would add
their own peak to both modes alike). Every 0.2 s the script reads each process's VmHWM (the kernel's
peak resident set, monotone) from /proc, so the last reading is the process's peak. Prints a table
and one JSON line, appended to results/target_load.jsonl.

    python benchmarks/target_load.py
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from common import record

ROOT = Path(__file__).resolve().parent.parent
TARGET = [f"--model.target.init_args.{k}={v}" for k, v in
          (("num_layers", 24), ("hidden_size", 1024), ("num_heads", 16), ("num_kv_heads", 8))]  # fmt: skip
PARAMS = 24 * (1024 * 1024 * 2 + 2 * 1024 * 512 + 3 * 1024 * 2048)  # decoder layers' weights


def peak_gib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        return None
    return None


def tree(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    kids = [int(p) for p in out.split()]
    return [pid] + [q for k in kids for q in tree(k)]


def run(name: str, extra: list[str], root: Path) -> dict:
    exe = str(Path(sys.executable).with_name("spec-drafters"))
    cmd = [exe, "fit", "--config", "tests/configs/tiny.yaml", "--config", "configs/presets/fsdp2_cpu.yaml",
           "--trainer.max_steps", "0", "--data.batch_size", "2", "--model.shard_target", "true",
           "--trainer.logger", "false", "--trainer.callbacks", "[]",
           "--trainer.enable_checkpointing", "false", "--trainer.default_root_dir", str(root / name),
           *TARGET, *extra]  # fmt: skip
    print("+", " ".join(cmd[1:]), file=sys.stderr)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peaks: dict[int, float] = {}
    while proc.poll() is None:
        for pid in tree(proc.pid):
            seen = peak_gib(pid)
            if seen is not None:
                peaks[pid] = max(peaks.get(pid, 0.0), seen)
        time.sleep(0.2)
    output = proc.stdout.read()
    if proc.returncode != 0:
        raise SystemExit(f"{name}: fit failed:\n{output[-3000:]}")
    # rank 0 is the CLI process itself; rank 1 the process Lightning started (the largest child)
    rank0 = peaks[proc.pid]
    rank1 = max(v for pid, v in peaks.items() if pid != proc.pid)
    return {"mode": name, "rank0_peak_gib": round(rank0, 3), "rank1_peak_gib": round(rank1, 3)}


def main() -> None:
    root = ROOT / "runs" / "target_load"
    rows = [run("every_rank", [], root), run("once", ["--model.load_target_once", "true"], root)]
    print(f"target: {PARAMS / 1e9:.2f}B decoder-layer parameters, {PARAMS * 4 / 2**30:.2f} GiB in fp32")
    print(f"{'mode':12s} {'rank 0 peak GiB':>16s} {'rank 1 peak GiB':>16s}")
    for r in rows:
        print(f"{r['mode']:12s} {r['rank0_peak_gib']:16.3f} {r['rank1_peak_gib']:16.3f}")
    saved = rows[0]["rank1_peak_gib"] - rows[1]["rank1_peak_gib"]
    summary = {"target_gib": round(PARAMS * 4 / 2**30, 3), "rank1_saved_gib": round(saved, 3), "rows": rows}
    record("target_load", [], summary)


if __name__ == "__main__":
    main()
