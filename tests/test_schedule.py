"""The default schedule by hand, and optimizer/scheduler chosen in YAML (AdamW + WarmupCosine by default)."""

import math

import pytest
import torch

from spec_drafters.cli.main import main
from spec_drafters.lightning.schedule import WarmupCosine

TINY = "tests/configs/tiny.yaml"


def test_warmup_cosine_by_hand():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = WarmupCosine(opt, total_steps=10, warmup_fraction=0.2, min_lr_ratio=0.1)  # warmup: 2 steps
    lrs = []
    for _ in range(11):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # steps 0, 1 warm up linearly to the peak; then 0.1 + 0.9 * (1 + cos(pi * (s - 2) / 8)) / 2, times 2.0
    want = [1.0, 2.0] + [2.0 * (0.1 + 0.45 * (1 + math.cos(math.pi * (s - 2) / 8))) for s in range(2, 11)]
    assert lrs == pytest.approx(want)
    assert lrs[2] == pytest.approx(2.0) and lrs[10] == pytest.approx(0.2)


def _fit(tmp_path, *extra) -> dict:
    main(
        [
            "fit",
            "--config",
            TINY,
            "--trainer.max_steps",
            "2",
            "--trainer.default_root_dir",
            str(tmp_path),
            *extra,
        ]
    )
    (ckpt,) = tmp_path.rglob("last.ckpt")
    return torch.load(ckpt, weights_only=True)


def test_default_is_adamw_with_warmup_cosine(tmp_path):
    ckpt = _fit(tmp_path)
    group = ckpt["optimizer_states"][0]["param_groups"][0]
    assert group["betas"] == (0.9, 0.95) and group["initial_lr"] == pytest.approx(0.003)  # tiny.yaml's lr
    assert "warmup" in ckpt["lr_schedulers"][0] and "min_lr_ratio" in ckpt["lr_schedulers"][0]


def test_optimizer_and_scheduler_from_the_command_line(tmp_path):
    sgd = ["--model.optimizer", "torch.optim.SGD", "--model.optimizer.lr", "0.05"]
    sgd += ["--model.optimizer.momentum", "0.9"]
    constant = [
        "--model.lr_scheduler",
        "torch.optim.lr_scheduler.ConstantLR",
        "--model.lr_scheduler.factor",
        "0.5",
    ]
    ckpt = _fit(tmp_path, *sgd, *constant)
    group = ckpt["optimizer_states"][0]["param_groups"][0]
    assert group["momentum"] == 0.9 and group["initial_lr"] == pytest.approx(0.05) and "betas" not in group
    assert ckpt["lr_schedulers"][0]["factor"] == 0.5


def test_muon_with_adamw_splits_matrices_from_the_rest_and_resumes_exactly(tmp_path):
    from spec_drafters.lightning.schedule import MuonWithAdamW

    w, b = torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(4))
    opt = MuonWithAdamW([w, b], lr=0.02, adamw_lr=0.001)
    assert [len(g["params"]) for g in opt.param_groups] == [1, 1] and opt.param_groups[0]["params"][0] is w
    WarmupCosine(opt, total_steps=4, warmup_fraction=0.5)  # sets the first step's lr in both groups
    assert opt.muon.param_groups[0]["lr"] == pytest.approx(0.01)  # the scheduler reaches the inner groups

    def run(steps, state=None):
        torch.manual_seed(0)
        w, b = torch.nn.Parameter(torch.ones(4, 3)), torch.nn.Parameter(torch.ones(4))
        opt = MuonWithAdamW([w, b])
        if state is not None:
            w.data, b.data = state["w"].clone(), state["b"].clone()
            opt.load_state_dict(state["opt"])
        for _ in range(steps):
            opt.zero_grad()
            ((w.sum(1) * b).square().sum() + w.square().sum()).backward()
            opt.step()
        return {"w": w.detach().clone(), "b": b.detach().clone(), "opt": opt.state_dict()}

    whole = run(4)
    half = run(2, run(2))  # momentum and Adam moments carried through state_dict
    assert torch.equal(whole["w"], half["w"]) and torch.equal(whole["b"], half["b"])


def test_muon_recipe_trains_from_the_command_line(tmp_path):
    muon = [
        "--model.optimizer",
        "spec_drafters.lightning.schedule.MuonWithAdamW",
        "--model.optimizer.lr",
        "0.02",
    ]
    ckpt = _fit(tmp_path, *muon)
    assert set(ckpt["optimizer_states"][0]) == {"muon", "adamw", "param_groups"}
