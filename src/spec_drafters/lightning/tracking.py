"""Experiment tracking: Aim by default (its repository inside the run folder), CSV or TensorBoard instead,
and the per-slot acceptance figure every validation logs to whichever of them is in use.

Browse an Aim run with ``aim up --repo <run folder>`` (the quickstart's: ``aim up --repo runs/quickstart``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger


class RunAimLogger(Logger):
    """Aim with this project's defaults; Aim itself is imported only when this logger is built.

    A Lightning logger that hands every call to Aim's ``AimLogger``, created in ``__init__``: importing
    this module (every ``spec-drafters`` command that might train does) never loads Aim, and neither
    does a run that picks another logger.

    Args:
        repo: the Aim repository; by default the run folder (``--trainer.default_root_dir``).
        experiment: the experiment name the run is filed under.
        run_name: a name for this run in the Aim UI.
        capture_terminal_logs: also store the run's terminal output in Aim.

    System parameters are never logged: with setuptools >= 81, Aim's collector crashes at start
    ("No module named pkg_resources").
    """

    def __init__(
        self,
        repo: str | None = None,
        experiment: str = "spec-drafters",
        run_name: str | None = None,
        capture_terminal_logs: bool = False,
    ):
        from aim.pytorch_lightning import AimLogger

        super().__init__()
        self.aim = AimLogger(
            repo=repo,
            experiment=experiment,
            run_name=run_name,
            log_system_params=False,
            capture_terminal_logs=capture_terminal_logs,
        )

    def place_in(self, run_dir: str) -> None:
        """Puts the repository in ``run_dir`` unless one was given (called by the CLI)."""
        if self.aim._repo_path is None:
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            self.aim._repo_path = str(run_dir)

    @property
    def repo(self) -> str | None:
        return self.aim._repo_path

    @property
    def save_dir(self) -> str:
        # The run folder itself (Aim's default is the hidden .aim inside it): Lightning writes
        # ``trainer.log_dir`` files (calibration.json, decode.jsonl) there.
        return self.aim._repo_path or "."

    @property
    def experiment(self):  # the aim.Run, created on first use (a dummy on ranks other than 0)
        return self.aim.experiment

    @property
    def name(self) -> str:
        return self.aim.name

    @property
    def version(self) -> str:
        return self.aim.version

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        self.aim.log_hyperparams(params)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.aim.log_metrics(metrics, step)

    def finalize(self, status: str) -> None:
        self.aim.finalize(status)


def aim_logger(logger: Logger):
    """The ``AimLogger`` behind ``logger``, or None. Never imports Aim: a logger of Aim's own class
    exists only if something imported it already."""
    if isinstance(logger, RunAimLogger):
        return logger.aim
    adapter = sys.modules.get("aim.sdk.adapters.pytorch_lightning")
    return logger if adapter is not None and isinstance(logger, adapter.AimLogger) else None


def acceptance_figure(acc_per_slot: list[float], curves: dict[str, list[float]], step: int):
    """A matplotlib figure: per-slot accuracy, and P(accepted length >= d) for each verifier."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    slots = list(range(1, len(acc_per_slot) + 1))
    left.bar(slots, acc_per_slot, color="#4477aa")
    left.set(xlabel="block slot k", ylabel="teacher-forced accuracy", title="per-slot accuracy", ylim=(0, 1))
    for label, curve in curves.items():
        right.plot(range(1, len(curve) + 1), curve, marker="o", label=label)
    right.set(xlabel="depth d", ylabel="P(accepted >= d)", title="acceptance curve", ylim=(0, 1))
    right.legend(fontsize=7)
    fig.suptitle(f"validation at step {step}")
    fig.tight_layout()
    return fig


def log_acceptance_figure(trainer, acc_per_slot: list[float], curves: dict[str, list[float]]) -> list[str]:
    """Logs the figure to every logger that can hold one; returns where it went (for the tests)."""
    if not trainer.is_global_zero or not trainer.loggers:
        return []
    import matplotlib.pyplot as plt

    step = trainer.global_step
    fig = acceptance_figure(acc_per_slot, curves, step)
    where = []
    for logger in trainer.loggers:
        aim = aim_logger(logger)
        if aim is not None:
            from aim import Image

            aim.experiment.track(Image(fig), name="acceptance_curve", step=step, context={"subset": "val"})
            where.append("aim")
        elif isinstance(logger, TensorBoardLogger):
            logger.experiment.add_figure("val/acceptance_curve", fig, global_step=step, close=False)
            where.append("tensorboard")
        elif isinstance(logger, CSVLogger):
            path = Path(logger.log_dir) / f"acceptance_curve_step{step}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=90)
            where.append(str(path))
    plt.close(fig)
    return where


def log_validation(
    trainer, acc_per_slot: list[float], curves: dict[str, list[float]], calibration: dict
) -> None:
    """A validation's artefacts: the acceptance figure for every logger that holds figures, and the
    calibration table as calibration.json in the run's log folder."""
    log_acceptance_figure(trainer, acc_per_slot, curves)
    log_dir = trainer.log_dir  # a broadcast under data parallelism: every rank asks, once
    if log_dir and trainer.is_global_zero:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        (Path(log_dir) / "calibration.json").write_text(json.dumps(calibration, indent=1) + "\n")
