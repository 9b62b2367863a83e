"""Peer benchmark: the DFlash training step of vllm-project/speculators, on CPU, in its own venv.

Run from the repository root after ``bash benchmarks/peer_setup.sh``::

    .peer-venv/bin/python benchmarks/peer_speculators.py --hidden 576 --heads 9 --kv-heads 3 \\
        --head-dim 64 --intermediate 1536 --layers 1 --vocab 49152 --num-target-layers 30 \\
        --N 64 --K 16 --S 512 --repeats 3

It imports nothing from spec_drafters but the timer (spec_drafters/clock.py, standard library only, by
path). It builds speculators' ``DFlashDraftModel``
(speculators/models/dflash/core.py) from a ``DFlashSpeculatorConfig`` made in code (a random Qwen3
decoder config standing in for the verifier; no download), fills the verifier-owned frozen weights
(embed_tokens, lm_head, verifier_lm_head: one tied random matrix) and times
``model(**batch, **train_kwargs)`` -> ``loss.backward()``, which is exactly what
``speculators.train.trainer.Trainer.train_epoch`` does per step (the optimizer step, gradient
clipping and metric logging are not timed; the trainer's bf16 autocast is keyed to an accelerator
and is a no-op on CPU, so this runs in fp32 like ours).

The batch has our shape: one sequence of S tokens, N anchors (``max_anchors``; speculators samples
them itself from the loss mask), blocks of K = ``block_size`` tokens (anchor + K-1 mask tokens),
tapped target hidden states (1, S, 5*hidden) and the verifier's last hidden state (1, S, hidden)
from which speculators computes its targets with the frozen verifier lm_head.

Defaults are speculators 0.9.0's DFlash training defaults (``speculators.train`` CLI): attention
``simple_flex_attention``, loss ``ce`` on the verifier argmax, D-PACE per-position weights
(alpha 0.5), qwen3 draft layers of type ``sliding_attention`` (window 2048, causal inside a block
for dflash). Its default ``fused`` loss needs Triton (GPU); ``--loss-impl auto`` uses it when Triton
imports, else speculators' ``eager`` loss. If the training step fails (on CPU: FlexAttention has no
backward) the error is recorded and the forward + loss is timed under ``torch.no_grad``
("mode": "forward_only"). Unless ``--alt none``, a second process first times the same step with a
non-flex attention (``--alt sdpa`` by default) and its result is nested under "alt".

Memory: "peak_rss_mib" is ru_maxrss (the whole process, warm-up and its one-off compile included),
"rss_increase_mib" that minus the RSS right before the first step; "steady_*" is the same over the
timed repeats only (VmHWM reset after the warm-up). Times are the median of --repeats steps after one
warm-up step. Ends with exactly one JSON line on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import traceback
from pathlib import Path

# The package's timer, by path: this script runs in speculators' own venv, where spec_drafters is not
# installed; spec_drafters/__init__.py and clock.py import nothing beyond the standard library.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from spec_drafters.clock import median_seconds as timed


def _log(msg: str) -> None:
    print(f"[peer_speculators] {msg}", file=sys.stderr, flush=True)


def _rss_mib() -> float:
    """Current resident set size of this process, MiB."""
    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mib() -> float:
    """ru_maxrss: the process's peak RSS since it started, MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _hwm_mib() -> float | None:
    """VmHWM: peak RSS since the last reset_hwm(), MiB (None where /proc lacks it)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _reset_hwm() -> bool:
    """Reset VmHWM to the current RSS (Linux clear_refs 5), so it covers only what follows."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _target_layer_ids(num_target_layers: int, n: int = 5) -> list[int]:
    """n tapped layers spread over the target (the ids only size the fc input here)."""
    step = max(1, (num_target_layers - 1) // (n - 1))
    return [min(1 + i * step, num_target_layers - 1) for i in range(n)]


def build_model(args):
    import torch
    from speculators import SpeculatorsConfig, VerifierConfig
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Config

    layer_type = "sliding_attention" if args.layer_type == "sliding" else "full_attention"
    # What speculators.train.cli.create_transformer_layer_config builds from a verifier config,
    # with the verifier's numbers given here instead of read from a checkpoint.
    layer_cfg = Qwen3Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        hidden_act="silu",
        max_position_embeddings=max(8192, 2 * args.S),
        initializer_range=0.02,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        sliding_window=args.sliding_window,
        use_sliding_window=layer_type == "sliding_attention",
        layer_types=[layer_type] * args.layers,
    )
    layer_cfg.rope_parameters = {"rope_type": "default", "rope_theta": args.rope_theta}
    # DFlashDraftModel.from_training_args sets this from --draft-attn-impl.
    layer_cfg._attn_implementation = args.attention
    config = DFlashSpeculatorConfig(
        transformer_layer_config=layer_cfg,
        draft_vocab_size=args.vocab,  # full vocabulary: lm_head is the verifier's frozen head
        block_size=args.K,
        aux_hidden_state_layer_ids=_target_layer_ids(args.num_target_layers),
        mask_token_id=args.mask_token_id,
        sliding_window_non_causal=False,  # speculators' default for dflash
        sample_from_anchor=False,  # anchor is the bonus token; K-1 predicted slots
        speculators_config=SpeculatorsConfig(
            algorithm="dflash",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=args.K - 1)],
            default_proposal_method="greedy",
            # name_or_path=None: nothing is loaded from a verifier checkpoint.
            verifier=VerifierConfig(name_or_path=None, architectures=["Qwen3ForCausalLM"]),
        ),
    )
    torch.manual_seed(args.seed)
    model = DFlashDraftModel(config)
    # load_verifier_weights() would copy these from the verifier; speculators leaves them NaN until
    # then. One random matrix, tied like the SmolLM2 target's embedding/lm_head, all frozen.
    with torch.no_grad():
        w = torch.randn(args.vocab, args.hidden) * 0.02
        model.embed_tokens.weight.copy_(w)
        model.lm_head.weight.copy_(w)
        model.verifier_lm_head.weight.copy_(w)
    model.train()
    return model


def build_batch(args):
    import torch

    g = torch.Generator().manual_seed(args.seed)
    S, H = args.S, args.hidden
    n_taps = len(_target_layer_ids(args.num_target_layers))
    # The keys speculators' dataloader yields for a single-document packed sequence.
    return {
        "hidden_states": torch.randn((1, S, n_taps * H), generator=g),
        "input_ids": torch.randint(0, args.vocab, (1, S), generator=g),
        "loss_mask": torch.ones((1, S), dtype=torch.long),
        "verifier_last_hidden_states": torch.randn((1, S, H), generator=g),
        "document_ids": torch.zeros((1, S), dtype=torch.long),
    }


def resolve_loss_impl(choice: str) -> str:
    if choice != "auto":
        return choice
    try:
        import triton  # noqa: F401
    except ImportError:
        return "eager"
    import torch

    return "fused" if torch.cuda.is_available() else "eager"


def train_kwargs(args, loss_impl: str) -> dict:
    """What DFlashDraftModel.get_trainer_kwargs returns for the CLI's dflash defaults."""
    from speculators.models.dflash import DFlashDraftModel

    train_kw, _ = DFlashDraftModel.get_trainer_kwargs(
        loss_fn=args.loss_fn,
        loss_implementation=loss_impl,
        dflash_decay_gamma=args.gamma,
        max_anchors=args.N,
        per_position_loss_weight=args.per_position_loss_weight,
        dpace_alpha=0.5,
    )
    return train_kw


def run(args) -> dict:
    from importlib.metadata import version

    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    loss_impl = resolve_loss_impl(args.loss_impl)
    model = build_model(args)
    batch = build_batch(args)
    kw = train_kwargs(args, loss_impl)
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    _log(
        f"DFlashDraftModel: attention={model._attn_impl} loss={args.loss_fn}/{loss_impl} "
        f"trainable={n_train:,} frozen={n_frozen:,} threads={torch.get_num_threads()}"
    )

    def train_step():
        model.zero_grad(set_to_none=True)
        _, loss, _ = model(**batch, **kw)
        loss.backward()

    def forward_step():
        with torch.no_grad():
            model(**batch, **kw)

    result = {
        "peer": "speculators",
        "version": version("speculators"),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "N": args.N,
        "K": args.K,
        "S": args.S,
        "layers": args.layers,
        "vocab": args.vocab,
        "mode": "train",
        "step_s": None,
        "peak_rss_mib": None,
        "rss_increase_mib": None,
        "attention": args.attention,
        "layer_type": args.layer_type,
        "loss": f"{args.loss_fn}/{loss_impl}/{args.per_position_loss_weight}",
        "trainable_params": n_train,
        "error": None,
    }
    steady = {}

    def after_warmup():
        steady["reset"] = _reset_hwm()

    rss_before = _rss_mib()
    try:
        result["step_s"] = timed(train_step, args.repeats, after_warmup=after_warmup)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["mode"] = "forward_only"
        model.zero_grad(set_to_none=True)
        _log("training step failed; timing forward + loss under torch.no_grad")
        try:
            result["step_s"] = timed(forward_step, args.repeats, after_warmup=after_warmup)
        except Exception as exc2:
            traceback.print_exc(file=sys.stderr)
            result["mode"] = "failed"
            result["error"] += f" | forward_only: {type(exc2).__name__}: {exc2}"
    peak = _peak_rss_mib()
    result["peak_rss_mib"] = round(peak, 1)
    result["rss_increase_mib"] = round(peak - rss_before, 1)
    result["rss_before_step_mib"] = round(rss_before, 1)
    # Peak over the timed repeats only (after the warm-up step and its one-off compile work).
    hwm = _hwm_mib() if steady.get("reset") else None
    result["steady_peak_rss_mib"] = None if hwm is None else round(hwm, 1)
    result["steady_rss_increase_mib"] = None if hwm is None else round(hwm - rss_before, 1)
    if result["step_s"] is not None:
        result["step_s"] = round(result["step_s"], 4)
    return result


def run_alt(args, argv: list[str]) -> dict | None:
    """The same measurement with a non-flex attention, in a fresh process (its own peak RSS)."""
    cmd = [sys.executable, os.path.abspath(__file__), *argv, "--attention", args.alt, "--alt", "none"]
    _log(f"alternative attention: {args.alt} (subprocess)")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"attention": args.alt, "error": f"subprocess exited {proc.returncode}"}
    return json.loads(lines[-1])


def parse_args(argv: list[str]):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--layers", type=int, default=1, help="draft decoder layers")
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--num-target-layers", type=int, default=30)
    p.add_argument("--rope-theta", type=float, default=100000.0)
    p.add_argument("--N", type=int, default=64, help="anchors per sequence (max_anchors)")
    p.add_argument("--K", type=int, default=16, help="block size: anchor + K-1 mask tokens")
    p.add_argument("--S", type=int, default=512, help="sequence length")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mask-token-id", type=int, default=16)
    p.add_argument(
        "--attention",
        default="simple_flex_attention",
        choices=["simple_flex_attention", "sdpa", "eager"],
        help="speculators' --draft-attn-impl (default: its default, simple_flex_attention)",
    )
    p.add_argument(
        "--alt",
        default="sdpa",
        choices=["sdpa", "eager", "none"],
        help="also time this attention in a subprocess when --attention is flex (default sdpa)",
    )
    p.add_argument(
        "--layer-type",
        default="sliding",
        choices=["sliding", "full"],
        help="sliding: speculators' CLI default (window --sliding-window, causal within a block); "
        "full: full attention, bidirectional within a block",
    )
    p.add_argument("--sliding-window", type=int, default=2048)
    p.add_argument("--loss-fn", default="ce", help="speculators' --loss-fn (dflash default: ce)")
    p.add_argument(
        "--loss-impl",
        default="auto",
        choices=["auto", "fused", "eager"],
        help="auto: fused (speculators' default) when Triton and CUDA are there, else eager",
    )
    p.add_argument("--gamma", type=float, default=4.0)
    p.add_argument("--per-position-loss-weight", default="dpace", choices=["dpace", "fixed-exp-decay"])
    return p.parse_args(argv)


def main() -> None:
    argv = sys.argv[1:]
    args = parse_args(argv)
    alt = None
    if args.alt != "none" and args.attention == "simple_flex_attention":
        # First, while this process is still small: a child's ru_maxrss starts from the RSS of
        # the parent it was forked from (Linux keeps the hiwater mark across execve).
        alt = run_alt(args, argv)
    result = run(args)
    if alt is not None:
        result["alt"] = alt
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
