"""One speculative round against one plain greedy step on the embedded target, part by part.

Every cost is a ratio to one greedy step as ``greedy_generate`` takes it (the target's forward of one
token with its KV cache, the head, the argmax), measured in the same run, with the alternatives
interleaved and medians taken. Two kernel settings are compared side by side: ``plain`` (stock
``nn.Linear``, MKL) and ``packed`` (oneDNN with prepacked weights, ``decoding.packed_linears``, the
default); each ratio is to the greedy step of its own setting, and the ``packed`` column's
``greedy_step_vs_plain`` says how much faster the step itself became.

Rows: the target's forward over T new tokens (head included); the drafter's pass split into its
layers and the head over the K-1 draft slots (argmax; a full softmax for comparison; a simulated
draft vocabulary of V_d rows); the drafter context update; the DDTree build and the verify of its
B-node tree; whole rounds measured through the real ``speculative_generate`` (a difference of two
runs, so prefill and the budget-capped last rounds cancel), and the Python overhead (round minus
its parts). The drafter is untrained (cost does not depend on its weights) and shaped like
configs/quickstart.yaml's (2 layers, K = 8, 5 taps [1, 8, 14, 20, 27]); ``--ckpt`` takes an exported
drafter folder instead.

Run: ``PYTHONPATH=src python benchmarks/round_profile.py [--threads 1] [--repeats 9]``; parts are timed
each right after a greedy step (median of the pairs' ratios), whole decodes once every other repetition.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import time

import torch

from common import record
from spec_drafters import decoding
from spec_drafters.decoding import _positions, new_cache, tree_attention_mask
from spec_drafters.drafter import ContextCache, DFlashDrafter, DrafterConfig
from spec_drafters.kernels import PackedLinear, packed_linears
from spec_drafters.masks import DFlashBlockMask
from spec_drafters.prompts import HumanEvalPrompts
from spec_drafters.target import FrozenTarget, crop_cache
from spec_drafters.targets import EmbeddedSmolLM2
from spec_drafters.verifiers import DDTree, GreedyChain

TAPS = [1, 8, 14, 20, 27]
SETTINGS = ("plain", "packed")


def build(args):
    loaded = EmbeddedSmolLM2().load()
    target = FrozenTarget(loaded.model, TAPS)
    if args.ckpt:
        from spec_drafters.export import read_folder

        folder = read_folder(args.ckpt, num_target_layers=target.num_layers)
        drafter, fc_ids = folder.drafter.eval(), folder.fc_ids
    else:
        cfg = DrafterConfig(num_layers=2, block_size=args.block_size, attention="split").resolved(
            loaded.model.config, len(TAPS), loaded.card.mask_token_id, DFlashBlockMask().per_layer(2)
        )
        torch.manual_seed(0)
        drafter, fc_ids = DFlashDrafter(cfg).eval(), TAPS
    # ~200 tokens of context: a HumanEval prompt followed by the target's own greedy continuation.
    prompt = loaded.tokenizer.encode(HumanEvalPrompts(1).prompts()[0])
    more = decoding.greedy_generate(target, prompt, max(1, args.context - len(prompt)), eos_ids=[])
    context = (prompt + more.tokens)[: args.context]
    return target, drafter, fc_ids, context


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--budget", type=int, default=32, help="DDTree B")
    ap.add_argument("--rounds", type=int, default=8, help="rounds in the whole-round difference")
    ap.add_argument("--ckpt", default=None, help="an exported drafter folder (default: untrained)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with torch.no_grad():
        run(args)


def run(args) -> None:
    target, drafter, fc_ids, ctx = build(args)
    k, c = drafter.config.block_size, len(ctx)
    depth = k - 1
    vocab = target.vocab_size
    cache = new_cache(target)
    out = target(torch.tensor([ctx]), position_ids=_positions(0, c, "cpu"), cache=cache, use_cache=True)
    context = ContextCache(drafter)
    context.append(torch.cat([out.taps[i] for i in fc_ids], -1))
    bonus = int(target.head(out.hidden[:, -1]).argmax(-1))
    weight = target.lm_head.weight.detach()
    subsets = {vd: torch.nn.Linear(576, vd, bias=False) for vd in (4096, 8192, 16384)}
    for vd, lin in subsets.items():
        lin.weight.data = weight[:vd].clone()  # a frozen slice of the head (a draft vocabulary)
    packed_subsets = {vd: PackedLinear(lin) for vd, lin in subsets.items()}
    ddtree = DDTree(args.budget)

    def fwd(tokens, **kw):
        o = target(torch.tensor([tokens]), cache=cache, use_cache=True, **kw)
        r = target.head(o.hidden).argmax(-1)[0].tolist()
        crop_cache(cache, c)
        return o, r

    def greedy_step():  # greedy_generate's loop body
        o = target(torch.tensor([[bonus]]), position_ids=_positions(c, 1, "cpu"), cache=cache, use_cache=True)
        int(target.head(o.hidden[:, -1]).argmax(-1))
        crop_cache(cache, c)

    def forward_t(t):
        return lambda: fwd(ctx[:t], position_ids=_positions(c, t, "cpu"))

    def block_embeds():
        block = torch.full((1, k), drafter.config.mask_token_id)
        block[0, 0] = bonus
        return target.embed(block)

    def drafter_layers():
        return drafter(block_embeds(), _positions(c, k, "cpu"), context.kv)

    hidden = drafter_layers()[0, 1:]  # (K-1, H)
    logits = target.head(hidden)
    tree = ddtree.propose(logits)
    ids = [bonus, *tree.tokens]
    parents = [-1, *(p + 1 for p in tree.parents)]
    tree_pos = torch.tensor([[0, *tree.depths]]) + c

    def tree_verify():
        mask = tree_attention_mask(c, parents, torch.float32, "cpu")
        fwd(ids, position_ids=tree_pos, attention_mask=mask)

    def context_append():  # one committed position (an untrained drafter's rounds accept nothing)
        saved = (context.kv, context.length)
        o, _ = fwd([bonus], position_ids=_positions(c, 1, "cpu"))
        t0 = time.perf_counter()
        context.append(torch.cat([o.taps[i][:, [0]] for i in fc_ids], -1))
        context.kv, context.length = saved
        return time.perf_counter() - t0

    def topk_lse():  # DDTree's top-k without materialising a log-softmax over the vocabulary
        top = logits.float().topk(min(args.budget, vocab), dim=-1)
        return top.values - torch.logsumexp(logits.float(), -1, keepdim=True), top.indices

    parts = {
        "greedy_step": greedy_step,
        **{f"target_forward_T{t}": forward_t(t) for t in (1, 2, 4, 8, 16, 32)},
        f"drafter_layers_K{k}": drafter_layers,
        f"drafter_head_argmax_{depth}x{vocab}": lambda: target.head(hidden).argmax(-1).tolist(),
        f"drafter_head_softmax_{depth}x{vocab}": lambda: (
            torch.softmax(target.head(hidden), -1).argmax(-1).tolist()
        ),
        "greedy_chain_propose": lambda: GreedyChain().propose(logits),
        f"ddtree_build_B{args.budget}": lambda: ddtree.propose(logits),
        f"ddtree_topk_logsoftmax_B{args.budget}": lambda: torch.log_softmax(logits, -1).topk(args.budget, -1),
        f"ddtree_topk_minus_logsumexp_B{args.budget}": topk_lse,
        f"tree_verify_B{args.budget}": tree_verify,
        "context_append_1": context_append,
    }
    for vd in subsets:
        parts[f"drafter_head_argmax_{depth}x{vd}"] = lambda vd=vd: (
            (packed_subsets[vd] if setting == "packed" else subsets[vd])(hidden).argmax(-1).tolist()
        )

    n1 = 2 + k  # both runs end with the same budget-capped rounds; their difference is full rounds
    n2 = n1 + args.rounds
    prompt = ctx

    def spec(verifier, packed):
        return lambda n: decoding.speculative_generate(
            target, drafter, fc_ids, verifier, prompt, n, [], packed_linears=packed
        )

    def greedy(packed):
        return lambda n: decoding.greedy_generate(target, prompt, n, [], packed_linears=packed)

    # Paired ratios: every part is timed right after a greedy step of the same setting and reported
    # as the median of (part / that step), so that the machine's load drifting cancels out.
    ratios: dict[tuple[str, str], list[float]] = {}
    steps: dict[str, list[float]] = {s: [] for s in SETTINGS}
    whole: dict[tuple[str, str], list[float]] = {}  # per repetition: (t(n2) - t(n1)) / rounds
    taus: dict[str, float] = {}
    labels = ("greedy", "chain_round", f"ddtree_round_B{args.budget}")
    setting = "plain"
    order = random.Random(0)
    for rep in range(args.repeats + 1):  # the first repetition warms up (and packs)
        for setting in SETTINGS:
            with packed_linears(target, drafter) if setting == "packed" else contextlib.nullcontext():
                names = list(parts)
                order.shuffle(names)
                for name in names:
                    t0 = time.perf_counter()
                    greedy_step()
                    t1 = time.perf_counter()
                    inner = parts[name]()
                    t2 = time.perf_counter()
                    dt = inner if name == "context_append_1" else t2 - t1
                    if rep:
                        ratios.setdefault((setting, name), []).append(dt / (t1 - t0))
                        steps[setting].append(t1 - t0)
        if rep % 2 == 1:  # whole decodes are long: every other repetition, after the warm-up
            for label in labels:
                for setting in SETTINGS:
                    packed = setting == "packed"
                    decode = {
                        "greedy": greedy(packed),
                        "chain_round": spec(GreedyChain(), packed),
                        labels[2]: spec(DDTree(args.budget), packed),
                    }[label]
                    t = []
                    for n in (n1, n2):
                        t0 = time.perf_counter()
                        res = decode(n)
                        t.append(time.perf_counter() - t0)
                    whole.setdefault((setting, label), []).append((t[1] - t[0]) / args.rounds)
                    if label != "greedy":
                        taus[label] = res.tau

    def median(v):
        return sorted(v)[len(v) // 2]

    med = {key: median(v) for key, v in ratios.items()}
    base = {s: median(steps[s]) for s in SETTINGS}
    reps = len(whole[("plain", "greedy")])
    for setting in SETTINGS:
        g = whole[(setting, "greedy")]
        # Whole rounds through speculative_generate over greedy steps through greedy_generate, the
        # same repetition's (both include the decoders' own Python); and over the part-timed step.
        for label in labels[1:]:
            med[(setting, label + "_vs_greedy_generate")] = median(
                [r / s for r, s in zip(whole[(setting, label)], g, strict=True)]
            )
            med[(setting, label)] = median(whole[(setting, label)]) / base[setting]
        med[(setting, "greedy_generate_step")] = median(g) / base[setting]
        head = med[(setting, f"drafter_head_argmax_{depth}x{vocab}")]
        med[(setting, "drafter_pass")] = med[(setting, f"drafter_layers_K{k}")] + head
        append = med[(setting, "context_append_1")]
        chain_parts = (
            med[(setting, "drafter_pass")]
            + med[(setting, "greedy_chain_propose")]
            + med[(setting, f"target_forward_T{k}")]
            + append
        )
        tree_parts = (
            med[(setting, "drafter_pass")]
            + med[(setting, f"ddtree_build_B{args.budget}")]
            + med[(setting, f"tree_verify_B{args.budget}")]
            + append
        )
        med[(setting, "chain_round_python_overhead")] = med[(setting, "chain_round")] - chain_parts
        overhead = med[(setting, labels[2])] - tree_parts
        med[(setting, f"ddtree_round_python_overhead_B{args.budget}")] = overhead
    packed_vs_plain = median(
        [p / q for p, q in zip(whole[("packed", "greedy")], whole[("plain", "greedy")], strict=True)]
    )
    names = sorted(
        {n for _, n in med}, key=lambda n: (n not in parts, list(parts).index(n) if n in parts else 0)
    )
    rows = []
    print(
        f"threads {torch.get_num_threads()}, context {c}, K {k}, V {vocab}, repeats {args.repeats} "
        f"(whole decodes: {reps}, {args.rounds} rounds each)"
    )
    print(
        f"greedy step (part-timed medians): plain {base['plain'] * 1e3:.1f} ms, packed "
        f"{base['packed'] * 1e3:.1f} ms; greedy_generate step packed/plain, paired: {packed_vs_plain:.3f}"
    )
    print(f"{'part (ratio to the same setting' + chr(39) + 's greedy step)':>52} {'plain':>8} {'packed':>8}")
    for name in names:
        row = {"part": name}
        for s in SETTINGS:
            row[f"{s}_ratio"] = round(med[(s, name)], 4)
        rows.append(row)
        print(f"{name:>52} {row['plain_ratio']:>8.3f} {row['packed_ratio']:>8.3f}")
    summary = {
        "benchmark": "round_profile",
        "threads": torch.get_num_threads(),
        "context": c,
        "block_size": k,
        "greedy_step_ms": {s: round(base[s] * 1e3, 2) for s in SETTINGS},
        "packed_greedy_generate_step_vs_plain": round(packed_vs_plain, 4),
        "chain_round_vs_greedy_generate_step": {
            s: round(med[(s, "chain_round_vs_greedy_generate")], 3) for s in SETTINGS
        },
        "ddtree_round_vs_greedy_generate_step": {
            s: round(med[(s, labels[2] + "_vs_greedy_generate")], 3) for s in SETTINGS
        },
        "verify_forward_per_greedy_step": {s: round(med[(s, f"target_forward_T{k}")], 3) for s in SETTINGS},
        "drafter_pass_per_greedy_step": {s: round(med[(s, "drafter_pass")], 3) for s in SETTINGS},
        "untrained_tau": taus,
    }
    record("round_profile", rows, summary)


if __name__ == "__main__":
    main()
