"""The one runner of the studies in experiments/: each study a script of resumable stages
(studies/stages.py), started here in the background under ``nice`` with its command and commit written
first in its log, so that a session that ends (and kills what it started) leaves a log that says what
ran on which code, and the next session continues by starting the same command again.

    python experiments/run.py list                 # the studies, what each measures
    python experiments/run.py start ablation --steps 400    # in the background, niced; refuses a dirty tree
    python experiments/run.py status               # running or not, each log's last lines

Logs and run records live in ``runs/studies/<study>.{log,json}`` (git-ignored). The studies call the
CLI through ``run_cli`` (a subprocess of this interpreter, in the checkout).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from spec_drafters.studies.results import CHECKOUT, command_line, git_sha, uncommitted

STUDIES = CHECKOUT / "experiments"
RUNS = CHECKOUT / "runs" / "studies"


def run_cli(*args: str, threads: int | None = None, cwd: Path = CHECKOUT) -> None:
    """``spec-drafters ARGS`` in a subprocess of this interpreter (``threads``: its OMP_NUM_THREADS)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
    subprocess.run([sys.executable, "-m", "spec_drafters.cli.main", *args], check=True, cwd=cwd, env=env)


def fit_flags(run: Path, steps: int, csv_logs: bool) -> list[str]:
    """The flags of a study's resumable fit in its own folder ``run``: a trainer overlay (``steps`` steps,
    validated once at the end, a checkpoint every 50 steps and the last one kept, the throughput in its
    results; a CSV log under ``run/logs`` when ``csv_logs``), and ``--ckpt_path`` of the last checkpoint
    when a killed fit left one."""
    checkpoints = {"dirpath": str(run / "checkpoints"), "save_last": True, "save_top_k": 0}
    logger = [{"class_path": "CSVLogger", "init_args": {"save_dir": str(run), "name": "logs"}}]
    trainer = {
        "default_root_dir": str(run),
        "max_steps": steps,
        "val_check_interval": steps,
        "logger": logger if csv_logs else False,
        "callbacks": [
            {"class_path": "ModelCheckpoint", "init_args": {**checkpoints, "every_n_train_steps": 50}},
            {"class_path": "TrainingThroughput"},  # train/tokens_per_s in the results
        ],
    }
    run.mkdir(parents=True, exist_ok=True)
    (run / "trainer.yaml").write_text(json.dumps({"trainer": trainer}))  # JSON is YAML
    last = run / "checkpoints" / "last.ckpt"
    return ["--config", str(run / "trainer.yaml"), *(["--ckpt_path", str(last)] if last.is_file() else [])]


def studies(folder: Path | None = None) -> dict[str, str]:
    """Every study script in ``folder`` and the first line of its docstring."""
    out = {}
    for path in sorted((folder or STUDIES).glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        if path.stem != "run" and doc:
            out[path.stem] = doc.splitlines()[0]
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (an exited child not yet reaped, a zombie, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def start(study: str, args: list[str], dirty: bool = False, runs: Path = RUNS) -> dict:
    """Starts ``experiments/<study>.py ARGS`` in its own session under ``nice``; returns its run record."""
    if study not in studies():
        raise SystemExit(f"no study {study!r}; the studies are: {', '.join(studies())}")
    changed = uncommitted(CHECKOUT)
    if changed and not dirty:
        raise SystemExit(
            f"code differs from the commit ({', '.join(changed)}): commit first, so the results name the "
            "code they ran (or --dirty: the results lines then list these files)"
        )
    runs.mkdir(parents=True, exist_ok=True)
    record_file, log = runs / f"{study}.json", runs / f"{study}.log"
    if record_file.is_file() and alive(json.loads(record_file.read_text())["pid"]):
        raise SystemExit(f"{study} is running already (see {log})")
    cmd = ["nice", "-n", "5", sys.executable, str(STUDIES / f"{study}.py"), *args]
    record = {"study": study, "command": command_line(cmd[3:]), "git_sha": git_sha(CHECKOUT),
              "uncommitted": changed, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}  # fmt: skip
    with open(log, "a") as fh:
        fh.write(f"# {record['started']} commit {record['git_sha']}: {record['command']}\n")
        fh.flush()
        session = {"start_new_session": True}  # a session of its own: it outlives this shell's jobs
        proc = subprocess.Popen(cmd, cwd=CHECKOUT, stdout=fh, stderr=subprocess.STDOUT, **session)
    record["pid"] = proc.pid
    record_file.write_text(json.dumps(record, indent=1) + "\n")
    return record


def status(runs: Path = RUNS, lines: int = 3) -> list[dict]:
    """Each started study: its run record, whether it still runs, its log's last lines."""
    out = []
    for record_file in sorted(runs.glob("*.json")):
        record = json.loads(record_file.read_text())
        tail = (runs / f"{record['study']}.log").read_text().splitlines()[-lines:]
        out.append({**record, "running": alive(record["pid"]), "tail": tail})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the studies")
    go = sub.add_parser("start", help="start a study in the background (niced)")
    go.add_argument("study")
    go.add_argument("--dirty", action="store_true", help="start with uncommitted code changes")
    sub.add_parser("status", help="the started studies")
    args, rest = ap.parse_known_args(argv)
    if args.command == "list":
        for name, line in studies().items():
            print(f"{name:<14} {line}")
    elif args.command == "start":
        record = start(args.study, rest, args.dirty)
        print(f"started {record['study']} (pid {record['pid']}): log {RUNS / (args.study + '.log')}")
    else:
        for r in status():
            print(f"{r['study']}: {'running' if r['running'] else 'not running'} (pid {r['pid']}), "
                  f"started {r['started']} at {r['git_sha']}: {r['command']}")  # fmt: skip
            print("\n".join(f"    {line}" for line in r["tail"]))
