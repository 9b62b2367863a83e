"""Trust (issue 12, part b): checkpoints are never unpickled beyond plain data, a checkpoint that
does not fit the command line says so first, and small user-facing texts say what they mean."""

import http.server
import threading
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from conftest import tiny_drafter
from spec_drafters.cli.main import main
from spec_drafters.cli.setup_args import load_setup

TINY = "tests/configs/tiny.yaml"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ckpt")
    main(
        ["fit", "--config", TINY, "--trainer.max_steps", "2", "--trainer.default_root_dir", str(root),
         "--trainer.callbacks.dirpath", str(root)]
    )  # fmt: skip
    return root / "last.ckpt"


class _Payload:
    """Unpickling it creates ``marker``: a stand-in for any code a checkpoint could run."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def _evil_checkpoint(ckpt: Path, out: Path, marker: Path) -> Path:
    state = torch.load(ckpt, weights_only=True)
    state["payload"] = _Payload(marker)
    torch.save(state, out)
    return out


@pytest.fixture
def served(tmp_path):
    """Serves files of tmp_path on 127.0.0.1 for one test; yields (base URL, request log)."""
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(tmp_path), **kwargs)

        def do_GET(self):
            requests.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.parametrize("subcommand", ["validate", "fit"])
def test_a_served_checkpoint_is_refused_and_never_unpickled(ckpt, tmp_path, served, monkeypatch, subcommand):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))  # where torch.hub would download
    marker = tmp_path / "payload_ran"
    _evil_checkpoint(ckpt, tmp_path / "evil.ckpt", marker)
    url, requests = served
    with pytest.raises(SystemExit, match=r"--ckpt_path http://127\.0\.0\.1:\d+/evil\.ckpt: remote"):
        main(
            [subcommand, "--config", TINY, "--trainer.max_steps", "3", "--trainer.logger", "false",
             "--trainer.default_root_dir", str(tmp_path / "run"), "--ckpt_path", f"{url}/evil.ckpt"]
        )  # fmt: skip
    assert not marker.exists()
    assert requests == []  # refused before any download


def test_a_local_checkpoint_with_code_in_it_is_refused_by_name(ckpt, tmp_path):
    marker = tmp_path / "payload_ran"
    evil = _evil_checkpoint(ckpt, tmp_path / "evil.ckpt", marker)
    with pytest.raises(SystemExit, match=r"--ckpt_path .*evil\.ckpt: refused, it holds more than plain"):
        main(["validate", "--config", TINY, "--trainer.logger", "false", "--ckpt_path", str(evil)])
    assert not marker.exists()


def test_lightning_restores_checkpoints_as_plain_data_only(ckpt, tmp_path, monkeypatch):
    calls = []
    load = torch.load

    def recording_load(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", recording_load)
    main(
        ["validate", "--config", TINY, "--trainer.logger", "false", "--trainer.limit_val_batches", "1",
         "--trainer.default_root_dir", str(tmp_path), "--ckpt_path", str(ckpt)]
    )  # fmt: skip
    assert len(calls) >= 2 and all(w is True for w in calls), calls  # ours, then Lightning's restore
    with pytest.raises(SystemExit):  # and no flag turns it off
        main(["validate", "--config", TINY, "--ckpt_path", str(ckpt), "--weights_only", "false"])


def test_a_checkpoint_for_another_target_names_both_targets_first(ckpt):
    other = ["--model.target.init_args.num_layers", "2"]  # too shallow for the checkpoint's num_taps 3
    both = r"trained for target 'tiny-qwen3-6x32-s0', --model.target loads 'tiny-qwen3-2x32-s0'"
    with pytest.raises(SystemExit, match=both):  # a one-line error, no traceback
        main(["validate", "--config", TINY, "--ckpt_path", str(ckpt), *other])


def test_every_builtin_target_knows_its_name_before_loading():
    from spec_drafters.target.cards import TargetCard
    from spec_drafters.target.loaders import EmbeddedSmolLM2, HFPretrained, TinyRandom

    tiny = TinyRandom(architecture="llama", num_layers=3, seed=2)
    assert tiny.identity() == tiny.load().card.name == "tiny-llama-3x32-s2"
    assert EmbeddedSmolLM2().identity() == TargetCard.load(EmbeddedSmolLM2.card_name).name
    assert HFPretrained("models/SomeModel").identity() == "SomeModel"  # what _card_from_model names it


def test_a_flag_the_checkpoint_overrides_is_warned_about_with_both_values(ckpt, recwarn):
    module = load_setup(["--config", TINY, "--ckpt_path", str(ckpt), "--model.drafter.block_size", "8"])
    assert module.drafter.config.block_size == 4  # the checkpoint's shape wins, as documented
    (warning,) = [w for w in recwarn if "overridden" in str(w.message)]
    assert "--model.drafter.block_size 8 is overridden by the checkpoint's 4" in str(warning.message)
    recwarn.clear()
    load_setup(["--config", TINY, "--ckpt_path", str(ckpt), "--model.drafter.block_size", "4"])
    assert not [w for w in recwarn if "overridden" in str(w.message)]  # the same value: nothing to say


def test_a_missing_checkpoint_fails_before_anything_is_loaded_or_created(tmp_path, monkeypatch):
    from spec_drafters.target.loaders import TinyRandom

    def no_load(self):
        raise AssertionError("the target was loaded before --ckpt_path was checked")

    monkeypatch.setattr(TinyRandom, "load", no_load)
    monkeypatch.chdir(tmp_path)
    repo = Path(__file__).resolve().parents[1]
    with pytest.raises(SystemExit, match=r"--ckpt_path missing\.ckpt: no such file"):
        main(
            ["validate", "--config", str(repo / TINY), "--data.path", str(repo / "tests/data/tiny.jsonl"),
             "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", "logs",
             "--ckpt_path", "missing.ckpt"]
        )  # fmt: skip
    assert list(tmp_path.iterdir()) == []


# --- prompts longer than the target's context --------------------------------------------------------
def test_generate_refuses_a_prompt_past_the_context_before_decoding(ckpt):
    too_long = "x" * 4090  # byte tokens; the tiny target's context is 4096
    with pytest.raises(SystemExit, match=r"prompt 1 has 4090 tokens, \+ max_new_tokens 12 = 4102, more than"):
        main(
            ["generate", "--config", TINY, "--ckpt_path", str(ckpt), "--prompt", "def f():",
             "--prompt", too_long, "--max_new_tokens", "12"]
        )  # fmt: skip


def test_the_decoding_callback_checks_every_prompt_before_decoding_any(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from lightning.pytorch.trainer.states import TrainerFn

    from spec_drafters.data.prompts import JsonlPrompts
    from spec_drafters.lightning.callbacks import SpeculativeDecodingEval

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def f():"}\n' + f'{{"prompt": "{"y" * 4095}"}}\n')
    setup = load_setup(["--config", TINY], quiet=True)
    module = SimpleNamespace(built=setup)  # what the callback reads of the LightningModule
    decoded = []
    monkeypatch.setattr(setup, "speculate", lambda prompt, n, v=None: decoded.append(prompt))
    trainer = SimpleNamespace(
        sanity_checking=False, state=SimpleNamespace(fn=TrainerFn.VALIDATING), world_size=1
    )
    callback = SpeculativeDecodingEval(prompts=JsonlPrompts(str(prompts)), max_new_tokens=8)
    with pytest.raises(
        ValueError, match=r"SpeculativeDecodingEval: prompt 1 has 4095 tokens.*context of 4096"
    ):
        callback.on_validation_epoch_end(trainer, module)
    assert decoded == []


def test_greedy_and_speculative_decoding_refuse_to_run_past_the_context(qwen3_target):
    from spec_drafters.decode.generate import greedy_generate, speculative_generate
    from spec_drafters.decode.verifiers import GreedyChain

    prompt = [5] * 4000
    with pytest.raises(ValueError, match=r"the prompt has 4000 tokens, \+ max_new_tokens 100 = 4100"):
        greedy_generate(qwen3_target, prompt, 100, [])
    drafter = tiny_drafter(qwen3_target)
    with pytest.raises(ValueError, match=r"context of 4096 tokens \(max_position_embeddings\)"):
        speculative_generate(qwen3_target, drafter, [1, 2, 3], GreedyChain(), prompt, 100, [])


# --- small texts -------------------------------------------------------------------------------------
def test_registry_lists_unannotated_parameters_by_name_alone(capsys):
    from spec_drafters.registry import Entry

    class Plain:
        def __init__(self, a, b=2, c: int = 3):
            pass

    assert Entry("loss", "plain", Plain).parameters() == ["a", "b = 2", "c: int = 3"]
    main(["registry"])
    assert "_empty" not in capsys.readouterr().out


def test_validate_keeps_fits_config_yaml_and_writes_its_own(ckpt):
    run = ckpt.parent  # fit wrote its config.yaml here (logger false: the default root is the log dir)
    fit_config = (run / "config.yaml").read_text()
    assert "val_anchors: 16" in fit_config
    main(
        ["validate", "--config", TINY, "--ckpt_path", str(ckpt), "--trainer.default_root_dir", str(run),
         "--trainer.limit_val_batches", "1", "--model.val_anchors", "8"]
    )  # fmt: skip
    assert (run / "config.yaml").read_text() == fit_config
    assert "val_anchors: 8" in (run / "config_validate.yaml").read_text()


seen_epoch_texts: list[str] = []


class RecordEpochDescription(pl.Callback):
    """Keeps the progress bar's epoch text at the start of every training epoch (in seen_epoch_texts)."""

    def on_train_epoch_start(self, trainer, module):
        bar = trainer.progress_bar_callback
        seen_epoch_texts.append(bar._get_train_description(trainer.current_epoch).strip())


@pytest.mark.parametrize(
    ("limits", "descriptions"),
    [
        (["--trainer.max_steps", "2"], ["Epoch 0", "Epoch 1"]),  # Lightning's bar: "Epoch 0/-2"
        (["--trainer.max_steps", "-1", "--trainer.max_epochs", "2"], ["Epoch 0/1", "Epoch 1/1"]),
    ],
)
def test_the_progress_bar_shows_an_epoch_total_only_when_epochs_bound_the_run(tmp_path, limits, descriptions):
    seen_epoch_texts.clear()
    main(
        ["fit", "--config", TINY, "--trainer.enable_progress_bar", "true", "--data.max_train_records", "4",
         "--trainer.default_root_dir", str(tmp_path),
         "--trainer.callbacks+=test_trust_b.RecordEpochDescription", *limits]
    )  # fmt: skip
    assert seen_epoch_texts == descriptions
