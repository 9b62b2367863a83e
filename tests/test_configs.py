"""Every shipped YAML parses and instantiates: model, data module, and the trainer's strategy,
callbacks and loggers. The field reports' Qwen3.6-27B configs build the target from its card on the meta
device (no weights); GPU trainer presets are instantiated as objects, not run (no GPU here)."""

import json
from pathlib import Path

import pytest
import torch

from spec_drafters.cli.checks import check_argv_components
from spec_drafters.cli.lightning_cli import SpecDraftersCLI
from spec_drafters.lightning.datamodule import TextDataModule
from spec_drafters.lightning.module import DFlashModule
from spec_drafters.target.injection import AllButLast, AllTaps

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
SEEDS = ["dflash_v3", "dflash_v5", "dflash_v6", "ddtree_v6", "experiment_ddtree"]
TWINS = ["dflash_v3", "dflash_v5", "dflash_v6", "experiment_ddtree"]


class InstantiateOnly(SpecDraftersCLI):
    """Parses and instantiates everything LightningCLI would, but builds no Trainer and runs nothing."""

    def instantiate_trainer(self, **kwargs):
        return self.config_init[self.subcommand]["trainer"]

    def _run_subcommand(self, subcommand: str) -> None:
        pass


def instantiate(*args: str) -> InstantiateOnly:
    check_argv_components(list(args))
    return InstantiateOnly(
        DFlashModule, TextDataModule, args=list(args), parser_kwargs={"default_env": False}
    )


def describe(cli) -> dict:
    d = cli.model.describe()
    return {"fc_ids": d["fc_ids"], "taps": d["target"]["tap_ids"], **d["components"], "drafter": d["drafter"]}


@pytest.fixture(scope="module")
def twins():
    return {name: instantiate("fit", "--config", str(CONFIGS / "twins" / f"{name}.yaml")) for name in TWINS}


@pytest.fixture(scope="module")
def seeds():
    out = {}
    for name in SEEDS:
        cli = instantiate(
            "fit", "--config", str(CONFIGS / f"{name}.yaml"), "--model.target.init_args.meta=true"
        )
        out[name] = cli
    return out


def test_seed_configs_follow_the_seeds_table(seeds):
    d = {name: describe(cli) for name, cli in seeds.items()}
    assert (
        d["dflash_v6"]["fc_ids"] == [1, 16, 31, 46, 61] and d["dflash_v6"]["target_source"] == "model_output"
    )
    assert d["dflash_v5"]["fc_ids"] == [1, 16, 31, 46] and d["dflash_v5"]["taps"] == [1, 16, 31, 46, 61]
    assert (
        d["dflash_v5"]["target_source"] == "layer_logits"
        and d["dflash_v3"]["target_source"] == "layer_logits"
    )
    assert d["dflash_v3"]["fc_ids"] == [1, 16, 31, 46, 61]  # 61 feeds fc and the labels
    assert seeds["dflash_v5"].model.target_source.layer_id == 61
    gammas = {n: seeds[n].model.loss_fn for n in SEEDS}
    assert gammas["dflash_v6"].gamma == 4.0 and gammas["dflash_v5"].gamma == 7.0
    assert gammas["dflash_v3"].gamma == 10.0 and gammas["dflash_v3"].alpha == 0.15
    exp = seeds["experiment_ddtree"].model
    assert (
        d["experiment_ddtree"]["loss"] == "cap"
        and exp.loss_fn.main.alpha == 0.15
        and exp.loss_fn.main.gamma == 10
    )
    assert d["experiment_ddtree"]["drafter"]["layer_types"] == ["sliding_attention"] * 4 + ["full_attention"]
    assert d["experiment_ddtree"]["drafter"]["sliding_window"] == 2048
    assert d["experiment_ddtree"]["drafter"]["block_size"] == 32 and exp.anchor_sampler.max_anchors == 1024
    assert d["ddtree_v6"]["verifier"] == "ddtree" and d["dflash_v6"]["verifier"] == "greedy_chain"
    for name in SEEDS:
        assert d[name]["noise"] == "uniform"


def test_seed_drafter_matches_the_z_lab_reference_size(seeds):
    """z-lab's Qwen3.6-27B drafter has 1730M parameters (docs/method.md section 5), fc [5120, 25600]."""
    drafter = seeds["dflash_v6"].model.drafter
    assert drafter.fc.weight.shape == (5120, 25600) and drafter.fc.weight.is_meta
    assert round(sum(p.numel() for p in drafter.parameters()) / 1e6) == 1730
    assert seeds["dflash_v5"].model.drafter.fc.weight.shape == (5120, 20480)  # the 4-layer fc
    target = seeds["dflash_v6"].model.target
    assert target.num_layers == 64 and target.hidden_size == 5120 and target.vocab_size == 248320


def test_training_preset_builds_fsdp_on_8_gpus(seeds):
    trainer = seeds["dflash_v6"].trainer
    assert trainer.accelerator == "gpu" and trainer.devices == 8 and trainer.precision == "bf16-mixed"
    strategy = trainer.strategy
    assert type(strategy).__name__ == "ModelParallelStrategy"  # FSDP2: fully_shard in configure_model
    assert strategy._data_parallel_size == 8 and strategy._tensor_parallel_size == 1
    model = seeds["dflash_v6"].model
    assert model.hparams.loss_chunk_rows == 4096 and model.drafter.checkpoint_layers
    assert any(getattr(c, "__name__", "") == "ModelCheckpoint" or type(c).__name__ == "ModelCheckpoint"
               for c in trainer.callbacks)  # fmt: skip


def test_eval_preset_builds_fsdp_on_2_gpus():
    cli = instantiate(
        "validate",
        "--config", str(CONFIGS / "ddtree_v6.yaml"),
        "--trainer", str(CONFIGS / "presets" / "eval_2x_a6000.yaml"),
        "--model.target.init_args.meta=true",
    )  # fmt: skip
    assert cli.trainer.devices == 2 and cli.trainer.precision == "bf16-true"
    assert type(cli.trainer.strategy).__name__ == "ModelParallelStrategy"


def test_multinode_preset_shards_over_every_gpu_of_every_node():
    cli = instantiate(
        "fit",
        "--config", str(CONFIGS / "dflash_v6.yaml"),
        "--trainer", str(CONFIGS / "presets" / "train_multinode_fsdp2.yaml"),
        "--model.target.init_args.meta=true",
    )  # fmt: skip
    strategy = cli.trainer.strategy
    assert cli.trainer.num_nodes == 2 and cli.trainer.devices == 8
    assert strategy._data_parallel_size == 16 == cli.trainer.num_nodes * cli.trainer.devices


@pytest.mark.parametrize("name", TWINS)
def test_twins_make_the_same_choices_as_their_seed_config(seeds, twins, name):
    twin = describe(twins[name])
    seed = describe(seeds[name])
    for kind in ("injection", "target_source", "noise", "loss", "mask", "anchors"):
        assert twin[kind] == seed[kind], kind
    assert len(twin["fc_ids"]) == len(seed["fc_ids"]) and len(twin["taps"]) == len(seed["taps"])
    assert twin["drafter"]["block_size"] * 2 == seed["drafter"]["block_size"]


def test_quickstart_and_its_verifier_overlay_instantiate():
    cli = instantiate("fit", "--config", str(CONFIGS / "quickstart.yaml"))
    assert describe(cli)["fc_ids"] == [1, 8, 14, 20, 27]
    assert not any(p.is_meta for p in cli.model.drafter.parameters())
    cli = instantiate(
        "validate",
        "--config",
        str(CONFIGS / "quickstart.yaml"),
        "--config",
        str(CONFIGS / "verify_humaneval.yaml"),
    )
    assert list(cli.model.offline.verifiers) == ["chain", "ddtree_b8", "ddtree_b32", "ddtree_b128"]
    (callback,) = cli.trainer.callbacks
    assert [v.budget for v in callback.verifiers] == [8, 32, 128] and callback.prompt_lookup_tokens == 7


V6_TAPS = [1, 16, 31, 46, 61]  # Qwen3.6-27B's card default: z-lab's 5 taps over 64 layers
TWIN_TAPS = [1, 8, 14, 20, 27]  # SmolLM2-135M's card default: the same formula over 30 layers
#: What each shipped config's comments say it taps: (fc ids, every tapped id).
INTENDED_TAPS = {
    "dflash_v3.yaml": (V6_TAPS, V6_TAPS),  # 61 feeds fc and the labels
    "dflash_v5.yaml": (V6_TAPS[:-1], V6_TAPS),  # 61 for the labels only
    "dflash_v6.yaml": (V6_TAPS, V6_TAPS),
    "ddtree_v6.yaml": (V6_TAPS, V6_TAPS),
    "experiment_ddtree.yaml": (V6_TAPS, V6_TAPS),
    "quickstart.yaml": (TWIN_TAPS, TWIN_TAPS),
    "reference_smollm2.yaml": (TWIN_TAPS, TWIN_TAPS),
    "twins/dflash_v3.yaml": (TWIN_TAPS, TWIN_TAPS),
    "twins/dflash_v5.yaml": (TWIN_TAPS[:-1], TWIN_TAPS),
    "twins/dflash_v6.yaml": (TWIN_TAPS, TWIN_TAPS),
    "twins/experiment_ddtree.yaml": (TWIN_TAPS, TWIN_TAPS),
}
# no model of their own: read over another
OVERLAYS = {"verify_humaneval.yaml", "bench_humaneval.yaml", "reference_eval.yaml", "reference_stage2.yaml"}


def test_humaneval_benchmark_overlay_decodes_all_164_prompts_with_every_budget():
    cli = instantiate(
        "validate",
        "--config",
        str(CONFIGS / "quickstart.yaml"),
        "--config",
        str(CONFIGS / "bench_humaneval.yaml"),
    )
    (callback,) = cli.trainer.callbacks
    assert callback.prompts.num_prompts == 164 and callback.max_new_tokens == 64
    assert [v.budget for v in callback.verifiers] == [8, 16, 32, 64] and callback.prompt_lookup_tokens == 7


def reference(tmp_path) -> InstantiateOnly:
    """configs/reference_smollm2.yaml with a counts file of its own (make reference writes the real one)."""
    counts = tmp_path / "token_counts.json"
    counts.write_text(json.dumps({"counts": {str(t): 100 - t for t in range(100)}}))
    config = str(CONFIGS / "reference_smollm2.yaml")
    return instantiate("fit", "--config", config, "--model.draft_vocab.init_args.counts", str(counts))


def test_reference_config_drafts_over_its_draft_vocabulary_and_selects_on_held_out_tau(tmp_path):
    cli = reference(tmp_path)
    drafter = cli.model.drafter
    assert drafter.config.draft_vocab_size == 8192 and drafter.draft_ids[:100].tolist() == list(range(100))
    assert cli.model.describe()["components"]["draft_vocab"] == "frequent_tokens"
    best = [c for c in cli.trainer.callbacks if getattr(c, "monitor", None)]
    assert [(c.monitor, c.mode) for c in best] == [("val/tau", "max")]  # held-out stdlib, not HumanEval


def test_reference_eval_overlay_evaluates_the_folder_as_committed(tmp_path):
    """configs/reference_eval.yaml over the training config: the drafter's weights and its draft
    vocabulary both come from the folder (here one exported from the reference config with its own
    vocabulary), no counts file, and decoding runs chain + DDTree B=8 + prompt lookup on the prompts
    the quickstart decodes (make demo's last table compares the two on the same decodes)."""
    from spec_drafters.artefacts.folders import write_folder

    trained = reference(tmp_path).model
    with torch.no_grad():
        trained.drafter.fc.weight.normal_()  # weights the untrained config would not have
    folder = write_folder(trained.built.folder(), tmp_path / "drafter", "spec_drafters")
    overlay = ["--config", str(CONFIGS / "reference_eval.yaml"), "--model.init_from", str(folder)]
    overlay += ["--model.draft_vocab.init_args.path", str(folder)]
    cli = instantiate("validate", "--config", str(CONFIGS / "reference_smollm2.yaml"), *overlay)
    model = cli.model
    assert model.describe()["components"]["draft_vocab"] == "from_folder"
    assert torch.equal(model.drafter.draft_ids, trained.drafter.draft_ids)
    assert torch.equal(model.drafter.fc.weight, trained.drafter.fc.weight)
    (callback,) = cli.trainer.callbacks
    assert callback.prompts.num_prompts == 4 and callback.max_new_tokens == 64
    assert [v.label() for v in callback.verifiers] == ["ddtree_b8", "lookup_hybrid_ddtree_b8"]
    assert callback.prompt_lookup_tokens == 7
    assert cli.config["validate"]["data"]["path"] == "data/reference/answers/corpus.jsonl.gz"
    quickstart = instantiate("validate", "--config", str(CONFIGS / "quickstart.yaml")).trainer.callbacks
    (demo,) = [c for c in quickstart if type(c) is type(callback)]
    assert demo.prompts.prompts() == callback.prompts.prompts()
    assert demo.max_new_tokens == callback.max_new_tokens


def test_reference_stage2_overlay_continues_from_the_first_stage_in_a_folder_of_its_own(tmp_path):
    """configs/reference_stage2.yaml over the training config: weights from the first stage's export,
    its own schedule, and the first stage's checkpoint callbacks (same order, same settings) writing
    under runs/reference_stage2, so neither stage's resume point or best checkpoint is the other's."""
    from spec_drafters.artefacts.folders import write_folder

    first = reference(tmp_path)
    with torch.no_grad():
        first.model.drafter.fc.weight.normal_()
    folder = write_folder(first.model.built.folder(), tmp_path / "stage1", "spec_drafters")
    counts = first.config["fit"]["model"]["draft_vocab"]["init_args"]["counts"]
    cli = instantiate("fit", "--config", str(CONFIGS / "reference_smollm2.yaml"),
                      "--config", str(CONFIGS / "reference_stage2.yaml"), "--model.init_from", str(folder),
                      "--model.draft_vocab.init_args.counts", counts)  # fmt: skip
    assert torch.equal(cli.model.drafter.fc.weight, first.model.drafter.fc.weight)
    assert cli.trainer.max_steps == 2400 and cli.model.hparams.lr == 6e-4
    assert cli.config["fit"]["model"]["lr"] == 6e-4 and cli.config["fit"]["model"]["warmup_fraction"] == 0.02

    def checkpoints(callbacks):
        return [(c.dirpath, c.filename, c.monitor, c.save_top_k, c.save_last)
                for c in callbacks if type(c).__name__ == "ModelCheckpoint"]  # fmt: skip

    ours, theirs = checkpoints(cli.trainer.callbacks), checkpoints(first.trainer.callbacks)
    assert len(ours) == len(theirs) == 2
    for mine, base in zip(ours, theirs, strict=True):
        assert Path(mine[0]).parent == Path("runs/reference_stage2").resolve()
        assert Path(mine[0]).name == Path(base[0]).name and mine[1:] == base[1:]


def test_every_shipped_config_taps_the_layers_its_comments_name(seeds, twins, tmp_path):
    models = {f"{n}.yaml": cli.model for n, cli in seeds.items()}
    models |= {f"twins/{n}.yaml": cli.model for n, cli in twins.items()}
    models["quickstart.yaml"] = instantiate("fit", "--config", str(CONFIGS / "quickstart.yaml")).model
    models["reference_smollm2.yaml"] = reference(tmp_path).model
    shipped = {
        p.relative_to(CONFIGS).as_posix()
        for p in CONFIGS.rglob("*.yaml")
        if p.parent.name not in ("presets", "ablation")  # ablation/: test_ablation_recipes
    }
    assert shipped == INTENDED_TAPS.keys() | OVERLAYS
    for name, (fc, taps) in INTENDED_TAPS.items():
        model = models[name]
        assert (model.fc_ids, model.target.tap_ids) == (fc, taps), name
        injection = model.injection
        bare = (
            type(injection) in (AllTaps, AllButLast)
            and injection.layer_ids is None
            and injection.num_taps is None
        )
        if bare:  # "the card's default taps"; with num_taps, z-lab's formula (checked above by its result)
            assert model.card.default_tap_ids == taps, name


def test_every_yaml_is_covered():
    shipped = {p.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("*.yaml")}
    covered = {f"{n}.yaml" for n in SEEDS} | {f"twins/{n}.yaml" for n in SEEDS if n != "ddtree_v6"}
    covered |= {"quickstart.yaml", "presets/train_8x_blackwell_fsdp.yaml", "presets/eval_2x_a6000.yaml"}
    covered |= {"presets/cpu_twin.yaml", "verify_humaneval.yaml", "presets/train_multinode_fsdp2.yaml"}
    covered |= {"presets/fsdp2_cpu.yaml"}  # run by tests/test_fsdp2.py
    covered |= {
        "reference_smollm2.yaml",
        "reference_stage2.yaml",
        "bench_humaneval.yaml",
        "reference_eval.yaml",
    }
    covered |= {f"ablation/{p.name}" for p in (CONFIGS / "ablation").glob("*.yaml")}  # test_ablation_recipes
    assert shipped == covered, shipped ^ covered


def test_meta_target_cannot_be_trained_by_accident():
    with torch.device("cpu"):
        cli = instantiate(
            "fit", "--config", str(CONFIGS / "dflash_v6.yaml"), "--model.target.init_args.meta=true"
        )
    assert all(p.is_meta for p in cli.model.target.parameters())


ABLATION_TAPS = {
    "v3": (TWIN_TAPS, TWIN_TAPS),
    "v5": (TWIN_TAPS[:-1], TWIN_TAPS),
    "v6": (TWIN_TAPS, TWIN_TAPS),
}


def test_ablation_recipes():
    """Every recipe of experiments/ablation.py parses over the shared base and names what it says; v5 is
    built: it reads layer 27 of 30 ("61 of 64") for its labels and keeps it out of fc."""
    import yaml

    from spec_drafters.cli.lightning_cli import SpecDraftersCLI

    class ParseOnly(SpecDraftersCLI):
        def instantiate_classes(self) -> None:
            pass

        def _run_subcommand(self, subcommand: str) -> None:
            pass

    base = str(CONFIGS / "ablation" / "base.yaml")
    from spec_drafters.studies.recipes import RECIPES

    assert {p.stem for p in (CONFIGS / "ablation").glob("*.yaml")} == {"base", *RECIPES}
    for recipe in RECIPES:
        overlay = str(CONFIGS / "ablation" / f"{recipe}.yaml")
        cli = ParseOnly(DFlashModule, TextDataModule, args=["fit", "--config", base, "--config", overlay])
        wanted = yaml.safe_load(Path(overlay).read_text())["model"]["loss"]["class_path"]
        assert cli.config.fit.model.loss.class_path.endswith(wanted), recipe
        assert cli.config.fit.model.drafter.num_layers == 2 and cli.config.fit.trainer.max_steps == 400
    for recipe, (fc, taps) in ABLATION_TAPS.items():
        model = instantiate(
            "fit", "--config", base, "--config", str(CONFIGS / "ablation" / f"{recipe}.yaml")
        ).model
        assert (model.fc_ids, model.target.tap_ids) == (fc, taps), recipe


def test_dpace_recipe_is_speculators_without_the_window_and_v6_with_dpace():
    """The ablation's D-PACE control differs from its two neighbours in one thing each, so its row
    separates D-PACE's share of speculators' gain from the sliding window's."""
    import yaml

    def model(recipe):
        return yaml.safe_load((CONFIGS / "ablation" / f"{recipe}.yaml").read_text())["model"]

    dpace, speculators, v6 = model("dpace"), model("speculators_2026"), model("v6")
    assert {k: v for k, v in speculators.items() if k != "mask"} == dpace
    assert {k: v for k, v in dpace.items() if k != "loss"} == {k: v for k, v in v6.items() if k != "loss"}
    assert dpace["loss"]["class_path"] == v6["loss"]["class_path"] == "HardCE"
    assert dpace["loss"]["init_args"] == {"weights": {"class_path": "DPACE", "init_args": {"alpha": 0.5}}}


def test_reference_eval_reads_only_committed_files():
    """make demo runs this overlay on a fresh clone: its data file and drafter folder must be in the
    repository, not built by `make reference` (the joined corpus once was not, and the demo failed)."""
    import yaml

    root = Path(__file__).resolve().parent.parent
    overlay = yaml.safe_load((root / "configs" / "reference_eval.yaml").read_text())
    assert (root / overlay["data"]["path"]).is_file()
    folder = root / overlay["model"]["init_from"]
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert overlay["model"]["draft_vocab"]["init_args"]["path"] == overlay["model"]["init_from"]


def _header_commands(name: str) -> str:
    """The commands in a config's header comment, continuation lines joined."""
    lines = []
    for line in (CONFIGS / f"{name}.yaml").read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines).replace("\\ ", "")


@pytest.mark.parametrize("name", SEEDS)
def test_seed_header_commands_are_true(seeds, name):
    """The validate command of a seed's header shards the 55.6 GB target over the 48 GB cards, and its
    --ckpt_path is where the fit's checkpoint callback writes (not a folder under the Aim run's hash)."""
    header = _header_commands(name)
    validate = header[header.index("spec-drafters validate") :]
    assert "--trainer configs/presets/eval_2x_a6000.yaml" in validate
    assert "--model.shard_target true" in validate
    ckpt = Path(validate.split("--ckpt_path ")[1].split()[0])
    trainer = seeds[name].trainer
    (callback,) = [c for c in trainer.callbacks if type(c).__name__ == "ModelCheckpoint"]
    assert Path(callback.dirpath) == ckpt.parent.resolve() and ckpt.name == "last.ckpt" and callback.save_last
    assert Path(trainer.default_root_dir).resolve() == ckpt.parent.parent.resolve()


@pytest.mark.parametrize("name", SEEDS)
def test_seed_trainer_is_the_training_preset_with_its_own_folders(name):
    """The seeds write out configs/presets/train_8x_blackwell_fsdp.yaml (a config cannot name a trainer
    file and set trainer keys too); only the run's folders may differ from it."""
    import yaml

    preset = yaml.safe_load((CONFIGS / "presets" / "train_8x_blackwell_fsdp.yaml").read_text())
    trainer = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())["trainer"]
    assert trainer.pop("default_root_dir") == f"runs/{name}"
    assert trainer["callbacks"][0]["init_args"].pop("dirpath") == f"runs/{name}/checkpoints"
    assert trainer == preset
