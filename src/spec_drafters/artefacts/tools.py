"""``inspect``, ``diff`` and ``lint``: the questions the seeds answered by hand, one command each.

- inspect: what a drafter is, read from its weights' shapes first (the seeds learned that z-lab's
  reference used 5 layers from ``fc.weight`` [5120, 25600]) and checked against its config.
- diff: every architectural and training choice that differs between two drafters or configs.
- lint: known pitfalls of a config, before a long run, each with a severity and a one-line why.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from spec_drafters.artefacts.folders import read_checkpoint_file, read_config_json, read_weights
from spec_drafters.errors import InputError

# --- reading any drafter artefact ------------------------------------------------------------------


def _weights(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """(drafter weights with z-lab keys, the config/description that came with them)."""
    if path.suffix in (".yaml", ".yml"):  # a config: build it (large targets on the meta device)
        module = _module_from_config(str(path))
        weights = dict(module.drafter.state_dict())
        weights |= {"aux." + k: v for k, v in module.loss_fn.state_dict().items()}
        return weights, {"spec_drafters": module.describe(), "source": "config (built, not trained)"}
    if path.is_dir():
        if not (path / "model.safetensors").is_file():
            raise InputError(f"{path}: no model.safetensors")
        weights = read_weights(path / "model.safetensors")
        if not weights:
            raise InputError(f"{path / 'model.safetensors'}: holds no tensors")
        config = read_config_json(path / "config.json") if (path / "config.json").is_file() else {}
        return weights, config
    if not path.is_file():
        raise InputError(f"{path}: no such file or folder")
    ckpt = read_checkpoint_file(path)
    if "state_dict" not in ckpt:
        raise ValueError(f"{path}: neither a drafter folder nor a Lightning checkpoint")
    sd = ckpt["state_dict"]
    weights = {k[len("drafter.") :]: v for k, v in sd.items() if k.startswith("drafter.")}
    weights |= {"aux." + k[len("loss_fn.") :]: v for k, v in sd.items() if k.startswith("loss_fn.")}
    return weights, {
        "spec_drafters": ckpt.get("spec_drafters", {}),
        "hyper_parameters": ckpt.get("hyper_parameters"),
    }


def from_shapes(weights: dict[str, torch.Tensor]) -> dict:
    """Everything the weights' shapes alone say about a DFlash drafter."""
    if "fc.weight" not in weights:
        raise ValueError("no fc.weight: not a DFlash drafter")
    hidden, fc_in = weights["fc.weight"].shape
    layers = sorted({int(m.group(1)) for k in weights if (m := re.match(r"layers\.(\d+)\.", k))})
    out = {
        "hidden_size": hidden,
        "fc_in_features": fc_in,
        "injected_layers": fc_in / hidden if fc_in % hidden else fc_in // hidden,
        "drafter_layers": len(layers),
    }
    if layers:
        head_dim = weights["layers.0.self_attn.q_norm.weight"].shape[0]
        out["head_dim"] = head_dim
        out["num_heads"] = weights["layers.0.self_attn.q_proj.weight"].shape[0] // head_dim
        out["num_kv_heads"] = weights["layers.0.self_attn.k_proj.weight"].shape[0] // head_dim
        out["intermediate_size"] = weights["layers.0.mlp.gate_proj.weight"].shape[0]
    drafter = sum(v.numel() for k, v in weights.items() if not k.startswith("aux."))
    out["trainable_parameters"] = drafter + sum(v.numel() for k, v in weights.items() if k.startswith("aux."))
    out["aux_heads"] = sorted({k.split(".")[1] for k in weights if k.startswith("aux.")})
    return out


def _declared(config: dict) -> dict:
    """What a config (any layout) or a checkpoint description declares."""
    if config.get("spec_drafters"):
        block = config["spec_drafters"]
        d = block.get("drafter", {})
        target = block.get("target", {})
        return {
            "layout": config.get("source", "spec_drafters"),
            "target": target.get("name"),
            "num_target_layers": block.get("num_target_layers") or target.get("num_layers"),
            "vocab_size": config.get("vocab_size") or target.get("vocab_size"),
            "target_layer_ids": block.get("fc_ids"),
            "tapped_layer_ids": target.get("tap_ids"),
            "block_size": d.get("block_size"),
            "mask_token_id": d.get("mask_token_id"),
            "layer_types": d.get("layer_types"),
            "sliding_window": d.get("sliding_window"),
            "causal_block_layers": d.get("causal_block_layers"),
            "components": block.get("components"),
            "tied_embeddings": target.get("tied_embeddings"),
            **_heads(d, "num_heads", "num_kv_heads"),
        }
    if config.get("speculators_model_type") == "dflash":
        q = config.get("transformer_layer_config", {})
        return {
            "layout": "speculators",
            "vocab_size": config.get("draft_vocab_size"),
            "target_layer_ids": [i - 1 for i in config.get("aux_hidden_state_layer_ids") or []],
            "block_size": config.get("block_size"),
            "mask_token_id": config.get("mask_token_id"),
            "layer_types": q.get("layer_types"),
            "sliding_window": q.get("sliding_window"),
            **_heads(q, "num_attention_heads", "num_key_value_heads"),
        }
    if config:
        dflash = config.get("dflash_config", {})
        return {
            "layout": "zlab",
            "num_target_layers": config.get("num_target_layers"),
            "vocab_size": config.get("vocab_size"),
            "target_layer_ids": dflash.get("target_layer_ids"),
            "block_size": config.get("block_size") or dflash.get("block_size"),
            "mask_token_id": dflash.get("mask_token_id"),
            "layer_types": config.get("layer_types"),
            "sliding_window": config.get("sliding_window"),
            **_heads(config, "num_attention_heads", "num_key_value_heads"),
        }
    return {"layout": "none (weights only)"}


def _heads(fields: dict, heads: str, kv_heads: str) -> dict:
    """The attention shape a config declares, under this project's names."""
    return {
        "num_heads": fields.get(heads),
        "num_kv_heads": fields.get(kv_heads),
        "head_dim": fields.get("head_dim"),
    }


#: Declared fields that the weights' shapes also say: (HF config name, the weight that says it).
SHAPE_CHECKS = {
    "num_heads": ("num_attention_heads", "layers.0.self_attn.q_proj.weight"),
    "num_kv_heads": ("num_key_value_heads", "layers.0.self_attn.k_proj.weight"),
    "head_dim": ("head_dim", "layers.0.self_attn.q_norm.weight"),
}


def inspect_drafter(path: str | Path) -> dict:
    path = Path(path)
    weights, config = _weights(path)
    shapes = from_shapes(weights)
    declared = _declared(config)
    report = {"path": str(path), "from_weights": shapes, "declared": declared, "warnings": []}
    ids = declared.get("target_layer_ids")
    if ids is not None and len(ids) != shapes["injected_layers"]:
        report["warnings"].append(
            f"the config lists {len(ids)} target layers {ids}, but fc.weight "
            f"{[shapes['hidden_size'], shapes['fc_in_features']]} takes {shapes['injected_layers']}"
        )
    # A head count that disagrees with the weights can still load (same total width), then attends wrongly.
    for key, (name, weight) in SHAPE_CHECKS.items():
        said, got = declared.get(key), shapes.get(key)
        if said is not None and got is not None and said != got:
            report["warnings"].append(f"the config says {name} {said}, but {weight} holds {got}")
    types = declared.get("layer_types")
    if types and len(types) != shapes["drafter_layers"]:
        report["warnings"].append(
            f"layer_types has {len(types)} entries for {shapes['drafter_layers']} layers"
        )
    vocab = declared.get("vocab_size")
    if vocab:  # the target's embedding and head, frozen: one matrix when the target ties them
        matrices = 1 if declared.get("tied_embeddings") else 2
        report["frozen_parameters_shared_from_target"] = matrices * vocab * shapes["hidden_size"]
        report["frozen_note"] = (
            "tied embedding/head" if matrices == 1 else "embedding + head (untied or unknown)"
        )
    return report


def format_inspect(r: dict) -> str:
    s, d = r["from_weights"], r["declared"]
    lines = [f"{r['path']}  (layout: {d.get('layout')})"]
    fc = f"fc [{s['hidden_size']}, {s['fc_in_features']}] -> {s['injected_layers']} injected target layers"
    lines.append(f"  {fc}, target ids {d.get('target_layer_ids', '?')}")
    if d.get("tapped_layer_ids") and d["tapped_layer_ids"] != d.get("target_layer_ids"):
        lines.append(f"  tapped (incl. label-only layers): {d['tapped_layer_ids']}")
    lines.append(
        f"  {s['drafter_layers']} drafter layers, heads {s.get('num_heads')} / kv {s.get('num_kv_heads')} "
        f"x {s.get('head_dim')}, MLP {s.get('intermediate_size')}"
    )
    types = d.get("layer_types") or ["?"] * s["drafter_layers"]
    causal = set(d.get("causal_block_layers") or [])
    for i, t in enumerate(types):
        window = f", window {d.get('sliding_window')}" if t == "sliding_attention" else ""
        block = "causal" if i in causal else "bidirectional"
        lines.append(f"    layer {i}: {t}{window}, block {block}")
    lines.append(f"  block size {d.get('block_size', '?')}, mask token {d.get('mask_token_id', '?')}")
    target = d.get("target") or "?"
    lines.append(
        f"  target {target}: {d.get('num_target_layers', '?')} layers, vocabulary {d.get('vocab_size', '?')}"
    )
    frozen = r.get("frozen_parameters_shared_from_target")
    lines.append(
        f"  parameters: {s['trainable_parameters']:,} trainable (drafter"
        + (f" + {', '.join(s['aux_heads'])}" if s["aux_heads"] else "")
        + ")"
        + (f", {frozen:,} frozen from the target ({r['frozen_note']})" if frozen else "")
    )
    if d.get("components"):
        lines.append("  components: " + ", ".join(f"{k}={v}" for k, v in d["components"].items()))
    lines += [f"  WARNING: {w}" for w in r["warnings"]]
    return "\n".join(lines)


# --- choices, for diff -----------------------------------------------------------------------------


def _flatten(prefix: str, value, out: dict) -> None:
    if isinstance(value, dict) and "class_path" in value:
        out[prefix] = value["class_path"].rsplit(".", 1)[-1]
        for k, v in (value.get("init_args") or {}).items():
            _flatten(f"{prefix}.{k}", v, out)
    elif isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else k, v, out)
    else:
        out[prefix] = value


def _module_from_config(path: str):
    """The instantiated module of a config file (large targets on the meta device)."""
    from spec_drafters.cli.main import check_argv_components, load_module, read_config

    args = ["--config", path]
    cfg = read_config(path)
    target = ((cfg.get("model") or {}).get("target") or {}).get("class_path", "")
    if target.endswith("HFPretrained"):
        args.append("--model.target.init_args.meta=true")
    check_argv_components(args)
    return load_module(args, quiet=True)


def choices(path: str | Path) -> dict:
    """Every architectural and training choice of a config YAML, a drafter folder or a checkpoint."""
    path = Path(path)
    hp: dict = {}
    if path.suffix in (".yaml", ".yml"):
        from spec_drafters.registry import as_config

        module = _module_from_config(str(path))
        desc = module.describe()
        hp = {k: as_config(v) for k, v in module.hparams.items()}
    elif path.is_dir():
        from spec_drafters.artefacts.folders import read_folder

        folder = read_folder(path, num_target_layers=None if _has_depth(path) else 0)
        desc = {
            "target": {**folder.meta.get("target", {}), "num_layers": folder.num_target_layers or None},
            "fc_ids": folder.fc_ids,
            "drafter": asdict(folder.config),
            "components": folder.meta.get("components", {}),
        }
    else:
        ckpt = read_checkpoint_file(path)
        desc, hp = ckpt.get("spec_drafters") or {}, ckpt.get("hyper_parameters") or {}
    out: dict = {}
    target = desc.get("target", {})
    out["target.name"] = target.get("name")
    out["target.num_layers"] = target.get("num_layers")
    out["tapped_layer_ids"] = target.get("tap_ids")
    out["fc_layer_ids"] = desc.get("fc_ids")
    out["fc_layers"] = len(desc["fc_ids"]) if desc.get("fc_ids") else None
    for k, v in (desc.get("drafter") or {}).items():
        out[f"drafter.{k}"] = v
    for k, v in (desc.get("components") or {}).items():
        out[f"component.{k}"] = v
    for k, v in hp.items():
        if k not in ("target", "drafter"):
            _flatten(f"config.{k}", v, out)
    return {k: v for k, v in out.items() if v is not None}


def _has_depth(path: Path) -> bool:
    config = read_config_json(path / "config.json") if (path / "config.json").is_file() else {}
    return config.get("speculators_model_type") != "dflash" or "num_target_layers" in config


def diff(a: str | Path, b: str | Path, everything: bool = False) -> list[tuple[str, object, object]]:
    ca, cb = choices(a), choices(b)
    rows = []
    for key in sorted(ca.keys() | cb.keys()):
        va, vb = ca.get(key, "-"), cb.get(key, "-")
        if everything or va != vb:
            rows.append((key, va, vb))
    return rows


def format_diff(a, b, rows) -> str:
    if not rows:
        return f"no differences between {a} and {b}"
    la, lb = distinct_labels([Path(a), Path(b)])
    width = max(len(r[0]) for r in rows)
    va = max(12, len(la), *(len(str(r[1])) for r in rows))
    lines = [f"{'choice':<{width}}  {la:<{va}}  {lb}"]
    lines += [f"{k:<{width}}  {x!s:<{va}}  {y}" for k, x, y in rows]
    return "\n".join([*lines, legend([la, lb], [a, b])])


def distinct_labels(paths: list[Path]) -> list[str]:
    """Column labels: each path's shortest tail that no other path ends with (``a/last.ckpt`` and
    ``b/last.ckpt`` where names alone would be ``last.ckpt`` twice); the same path twice gets ``#2``."""
    parts = [p.parts for p in paths]
    labels = []
    for own in parts:
        others = [q for q in parts if q != own]  # the same path again is numbered below instead
        n = next((n for n in range(1, len(own)) if all(q[-n:] != own[-n:] for q in others)), len(own))
        labels.append(str(Path(*own[-n:])))
    seen: dict[str, int] = {}
    for i, label in enumerate(labels):
        seen[label] = seen.get(label, 0) + 1
        labels[i] = label if seen[label] == 1 else f"{label}#{seen[label]}"
    return labels


def legend(labels: list[str], paths: list) -> str:
    """One line saying which file each column is."""
    return "columns: " + ", ".join(f"{label} = {path}" for label, path in zip(labels, paths, strict=True))


# --- lint --------------------------------------------------------------------------------------------


#: Every lint code and its severity. ``--strict`` fails on warnings too; a config allows a warning it
#: makes on purpose (an ablation) with a ``# lint: allow CODE`` comment. Errors cannot be allowed.
CODES = {
    "config-invalid": "error",
    "mask-token-outside-vocab": "error",
    "mask-token-in-text": "error",
    "noise-reaches-labels": "error",
    "non-strict-context-mask": "error",
    "lint-allow-invalid": "error",
    "tap-kept-out-of-fc": "warning",
    "labels-not-model-output": "warning",
    "labels-from-dataset": "warning",
    "labels-unknown-source": "warning",
    "gamma-off": "warning",
    "gamma-unusual": "warning",
    "tap-ids-plus-one": "warning",
    "causal-block-on-full": "warning",
}


@dataclass
class Finding:
    severity: str  # "error" | "warning" | "allowed" (a warning the config allows)
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.severity:<7} {self.code:<22} {self.message}"


def lint_module(module, text_sample: list[str] | None = None) -> list[Finding]:
    """Known pitfalls of an instantiated DFlashModule (docs/method.md sections 1-2, 5)."""
    from spec_drafters.target.injection import zlab_layer_ids
    from spec_drafters.target.labels import DatasetTokens, LayerLogits, ModelOutput

    found: list[Finding] = []

    def add(code: str, *message: str) -> None:
        found.append(Finding(CODES[code], code, " ".join(message)))

    card, cfg = module.card, module.drafter.config
    depth, k = card.num_layers, cfg.block_size
    taps, fc = module.target.tap_ids, module.fc_ids

    # Noise must only ever touch a copy of the fc input (the seeds' v3 corrupted its labels).
    probe = torch.randn(1, 3, 4, generator=torch.Generator().manual_seed(0))
    before = probe.clone()
    module.noise(probe, torch.Generator().manual_seed(0))
    if not torch.equal(probe, before):
        add(
            "noise-reaches-labels",
            f"{type(module.noise).__name__} modifies its input in place;",
            "the tensors the labels are read from would carry the noise (the seeds' v3)",
        )

    label_layers = set(module.target_source.layer_ids(card)) | set(module.val_target_source.layer_ids(card))
    for i in sorted(set(taps) - set(fc)):
        why = "only for the labels" if i in label_layers else "and never used"
        add(
            "tap-kept-out-of-fc",
            f"layer {i} is tapped {why}, but not fed to fc:",
            "the drafter never sees it (the seeds' v5; z-lab feeds every tap to fc)",
        )

    source = module.target_source
    if isinstance(source, LayerLogits) and source.resolved_id(depth) != depth - 1:
        add(
            "labels-not-model-output",
            f"labels come from layer {source.resolved_id(depth)} of {depth}, not the model's output;",
            "the drafter learns a target that is not the one verifying it (the seeds' v3/v5: 61 of 64)",
        )
    elif isinstance(source, DatasetTokens):
        add(
            "labels-from-dataset",
            "labels are the dataset's tokens: right only for responses regenerated by this target",
        )
    elif not isinstance(source, (ModelOutput, LayerLogits)):
        add(
            "labels-unknown-source",
            f"{type(source).__name__}: check the labels are the target's output",
        )

    loss = module.loss_fn
    gamma = getattr(loss, "gamma", getattr(getattr(loss, "main", None), "gamma", "n/a"))
    if gamma is None:
        add(
            "gamma-off",
            f"uniform slot weights with K = {k}: rarely reached late slots weigh as",
            "much as slot 1 (published: gamma 7 for K = 16, 4 for K = 8)",
        )
    # K/4..K, as README documents it: the published gammas (K/2 and just under) sit well inside, and
    # so do the seeds' and the tiny test config's (10 for K = 16 and 32, K for K = 4).
    elif gamma != "n/a" and not k / 4 <= gamma <= k:
        add(
            "gamma-unusual",
            f"gamma {gamma} for K = {k} is outside K/4..K ({k / 4:g}..{k:g});",
            "published: 4 for K = 8, 7 for K = 16",
        )

    if not 0 <= cfg.mask_token_id < card.vocab_size:
        add(
            "mask-token-outside-vocab",
            f"mask token {cfg.mask_token_id} is outside the vocabulary 0..{card.vocab_size - 1}",
        )
    elif text_sample and module.tokenizer is not None:
        hits = sum(cfg.mask_token_id in module.tokenizer.encode(t) for t in text_sample)
        if hits:
            add(
                "mask-token-in-text",
                f"mask token {cfg.mask_token_id} occurs in {hits} of",
                f"{len(text_sample)} sampled training texts: drafts and context become indistinguishable",
            )

    if depth >= 4:
        for ids in (fc, taps):
            if len(ids) > 1 and ids == [i + 1 for i in zlab_layer_ids(depth, len(ids))]:
                add(
                    "tap-ids-plus-one",
                    f"{ids} are z-lab's default taps + 1: numbered like",
                    "speculators/vLLM? (ids here are 0-based decoder-layer outputs, as z-lab's)",
                )
                break

    # Probe the mask component: no block query may see its anchor's context entry or a later one.
    anchors, valid = torch.tensor([[3, 7]]), torch.tensor([[True, True]])
    for i, rule in enumerate(module.drafter.layer_rules()):
        m = module.mask.training_mask(anchors, valid, 12, k, rule)[0, 0]  # (2K, 12 + 2K)
        leaky = [p for j, p in enumerate((3, 7)) if m[j * k : (j + 1) * k, p:12].any()]
        if leaky:
            add(
                "non-strict-context-mask",
                f"drafter layer {i}: block queries see context at or after",
                f"their anchor ({leaky[0]}); those features do not exist when serving (SpecForge PR #473)",
            )
        if rule.causal_block and rule.window is None:
            add(
                "causal-block-on-full",
                f"drafter layer {i} is full attention but causal inside the",
                "block; the DFlash block is bidirectional (SpecForge PR #427)",
            )
    return found


def lint_config(argv: list[str]) -> list[Finding]:
    from spec_drafters.cli.main import check_argv_components, load_module, read_config
    from spec_drafters.target.loaders import MaskTokenError

    paths = [argv[i + 1] for i, a in enumerate(argv) if a in ("--config", "-c") and i + 1 < len(argv)]
    meta = []
    for p in paths:
        cfg = read_config(p)  # malformed YAML: one line naming the file and line
        target = ((cfg.get("model") or {}).get("target") or {}).get("class_path", "")
        if target.endswith("HFPretrained") and not Path(cfg["model"]["target"]["init_args"]["path"]).is_dir():
            meta = ["--model.target.init_args.meta=true"]  # the weights are not on this machine
    try:
        check_argv_components(argv)
        module = load_module([*argv, *meta], quiet=True)
    except MaskTokenError as e:
        return allow(paths, [Finding("error", "mask-token-outside-vocab", str(e))])
    except (ValueError, KeyError) as e:  # the module refuses to build: report why, as lint would
        return allow(paths, [Finding("error", "config-invalid", str(e))])
    sample = None
    data_path = None
    for p in paths:
        data_path = (read_config(p).get("data") or {}).get("path", data_path)
    if data_path and Path(data_path).is_file() and module.tokenizer is not None:
        from spec_drafters.data.records import read_jsonl

        records = [r for _, r in read_jsonl(data_path)][:200]
        sample = [r.get("text") or (r.get("prompt", "") + r.get("response", "")) for r in records]
    return allow(paths, lint_module(module, sample))


#: ``# lint: allow CODE[, CODE ...]`` anywhere in a config file, optionally followed by the reason. A
#: comment rather than a YAML key: LightningCLI refuses unknown keys, and fit/validate read the same file.
ALLOW = re.compile(r"#\s*lint:\s*allow\s+([\w-]+(?:\s*,\s*[\w-]+)*)")


def allow(paths: list[str], findings: list[Finding]) -> list[Finding]:
    """Marks the warnings the config files allow as "allowed" (still listed, never failing --strict)."""
    allowed: dict[str, str] = {}  # code -> where
    for path in paths:
        for n, line in enumerate(Path(path).read_text().splitlines(), start=1):
            for m in ALLOW.finditer(line):
                for code in re.split(r"\s*,\s*", m.group(1)):
                    problem = _allow_problem(code)
                    if problem:
                        findings.append(Finding("error", "lint-allow-invalid", f"{path}:{n}: {problem}"))
                    else:
                        allowed.setdefault(code, f"{path}:{n}")
    for f in findings:
        if f.severity == "warning" and f.code in allowed:
            f.severity, f.message = "allowed", f"{f.message} [allowed by {allowed[f.code]}]"
    return findings


def _allow_problem(code: str) -> str | None:
    if code not in CODES:
        warnings = sorted(c for c, severity in CODES.items() if severity == "warning")
        return f"unknown lint code {code!r} in '# lint: allow'; warnings: {', '.join(warnings)}"
    if CODES[code] == "error":
        return f"{code} is an error; '# lint: allow' accepts warnings only"
    return None
