"""A verify round's target side on a hybrid target (Gated-DeltaNet + attention) against one greedy step:
the verify forward and the state handling, for the project's mechanism and the alternatives (issue 31).

On a Gated-DeltaNet layer a rejected draft cannot be cropped: the layer keeps one recurrent state, not
one entry per token (docs/hybrid_targets.md). Three ways to roll it back, for a chain of K verified
tokens (the bonus and K-1 drafts) of which a drafts are accepted:

- ``commit`` (the project's, decode/hybrid.py): the verify runs under ``hybrid.tree_forward`` (the
  recurrent layers read the round's tokens as one chunk and write nothing), then ``hybrid.commit``
  sets each layer's window and state to the accepted path's (a rank-(a+1) update) and compacts the
  attention KV. The same two calls verify a DDTree of B nodes.
- ``record``: transformers' past-state recording (``cache.activate_past_recording``, once per decode),
  the stock forward, then ``cache.crop``. Recording runs the round's last K tokens through the
  one-token recurrent kernel and clones the state after each: it is the "per-token states kept during
  the verify" mechanism, so that one is not measured apart.
- ``rerun``: a snapshot of the recurrent layers' windows and states before the stock forward; on a
  rejection (a < K-1) the snapshot is restored, the attention layers cropped and the a+1 accepted
  tokens re-run through the whole target.

``record`` and ``rerun`` cannot verify a tree (the stock forward reads a node's siblings as its past),
so DDTree rows are the project's mechanism only. Every figure is a ratio to one plain greedy step
(``generate.greedy_step``: one token's forward with the cache, the head, the argmax), each part timed
right after a greedy step of its own and the median of the pairs' ratios taken (load drift cancels).
The verify includes the head and the argmax over the verified tokens; "state" is the state
handling; ``verify-stock`` is the verify minus the stock forward of as many tokens (what the
mechanism adds inside the forward: recording's one-token kernel, the tree forward's gather and
solves). Before any timing, each mechanism's cache after a round is checked against the cache plain
greedy steps over the same committed tokens leave (and the verify's logits and the next step's
against theirs): a fast but wrong mechanism stops the run.

The targets are random ``TinyRandom(architecture="qwen3_5")`` hybrids (8 layers: 6 Gated-DeltaNet, 2
attention, float32) at hidden sizes 32 and 256 (at 32 the step is mostly Python overhead).
``--paper`` adds the state handling's bytes and FLOPs per round on the 27B card
(registry/targets/qwen3.6-27b.yaml, built on the meta device), as shares of one greedy step's.

Run: ``PYTHONPATH=src python benchmarks/hybrid_round.py --paper [--threads 1] [--repeats 15]
[--record]``; ``--record`` appends the run to results/hybrid_round.jsonl; the last line printed is
the run's JSON summary.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import time

import torch
from transformers.cache_utils import LinearAttentionCacheLayerMixin

from common import record
from spec_drafters.decode import generate, hybrid
from spec_drafters.decode.rounds import new_cache, tree_attention_mask
from spec_drafters.decode.rounds import positions as _positions
from spec_drafters.decode.verifiers import DDTree
from spec_drafters.target.frozen import FrozenTarget
from spec_drafters.target.loaders import HFPretrained, TinyRandom

TOL = 1e-4  # float32: the chunked and the one-token kernels round differently
NEXT = 7  # the token both caches read after the round, to compare what they give next
# What the paper section counts for each mechanism (printed, and kept in the JSON).
PAPER_COUNTS = {
    "commit": "reads each layer's state and the round's k and corrected v once, writes the path's state; "
    "2 H dk dv (T+1) FLOPs a layer (the sum runs over all T verified tokens, off-path ones weighted 0)",
    "record": "every verified token's state cloned (read + write) during the verify; transformers also "
    "runs those tokens through its one-token kernel instead of the chunked one (not counted)",
    "rerun": "a snapshot every round (read + write); a rejected round restores it and re-runs the a+1 "
    "accepted tokens through the whole target: one more read of the weights, (a+1) tokens' FLOPs",
    "per_node_states": "a tree recurrence keeping every node's state: each node reads its parent's "
    "state and writes its own",
}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--hidden_size", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--num_layers", type=int, default=8)
    ap.add_argument("--prompt_tokens", type=int, default=40)
    ap.add_argument("--chain_tokens", type=int, nargs="+", default=[8, 16], help="K: tokens a chain verifies")
    ap.add_argument("--budgets", type=int, nargs="+", default=[8, 32], help="DDTree B")
    ap.add_argument("--tree_depth", type=int, default=15, help="drafter slots the DDTree is built from")
    ap.add_argument("--timing", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--paper", action="store_true", help="add the 27B card's costs on paper")
    ap.add_argument("--card", default="qwen3.6-27b")
    ap.add_argument("--paper_context", type=int, default=4096, help="context for the copy-everything line")
    ap.add_argument("--record", action="store_true", help="append to results/hybrid_round.jsonl")
    args = ap.parse_args(argv)
    if min(args.chain_tokens) < 2 or min(args.budgets) < 1 or args.prompt_tokens < 1 or args.repeats < 1:
        ap.error("--chain_tokens must be >= 2, --budgets, --prompt_tokens and --repeats >= 1")
    if args.tree_depth < 1 or any(h < 8 or h % 4 for h in args.hidden_size):
        ap.error(
            "--tree_depth must be >= 1 and --hidden_size a multiple of 4 (the tiny target's 4 heads), >= 8"
        )
    torch.set_num_threads(args.threads)
    summary: dict = {"benchmark": "hybrid_round", "threads": args.threads, "repeats": args.repeats}
    rows: list[dict] = []
    with torch.no_grad():
        if args.timing:
            summary["prompt_tokens"], summary["targets"] = args.prompt_tokens, []
            for hidden in args.hidden_size:
                target_rows, target_summary = run_target(args, hidden)
                rows += target_rows
                summary["targets"].append(target_summary)
        if args.paper:
            summary["paper"] = paper(args.card, args.chain_tokens, args.budgets, args.paper_context)
    if args.record:
        record("hybrid_round", rows, summary)
    else:
        print(json.dumps(summary))
    return summary


# ------------------------------------------------------------------ the target and its caches


class Bench:
    """One random hybrid target, a prefilled cache to copy from, and the round's tokens."""

    def __init__(self, args, hidden: int):
        torch.manual_seed(0)
        loaded = TinyRandom("qwen3_5", num_layers=args.num_layers, hidden_size=hidden, dtype="float32").load()
        self.target = FrozenTarget(loaded.model, [1])
        rng = random.Random(0)
        self.prompt = [rng.randrange(256) for _ in range(args.prompt_tokens)]
        self.start = len(self.prompt)
        self.prefilled = new_cache(self.target)
        out = self.target(torch.tensor([self.prompt]), cache=self.prefilled, use_cache=True)
        self.bonus = int(self.target.head(out.hidden[:, -1]).argmax(-1))
        self.drafts = [rng.randrange(256) for _ in range(max(args.chain_tokens) - 1)]

    def fresh(self):
        """A copy of the cache after the prompt: every round and greedy step starts from it."""
        return copy.deepcopy(self.prefilled)

    def chain(self, k: int) -> list[int]:
        return [self.bonus, *self.drafts[: k - 1]]

    def forward(self, cache, ids: list[int], positions=None, mask=None) -> torch.Tensor:
        """The target over ``ids`` after the cache's positions -> logits (T, V)."""
        positions = _positions(self.start, len(ids), "cpu") if positions is None else positions
        out = self.target(
            torch.tensor([ids]), position_ids=positions, attention_mask=mask, cache=cache, use_cache=True
        )
        return self.target.head(out.hidden)[0]


def linear_layers(cache) -> list:
    return [layer for layer in cache.layers if isinstance(layer, LinearAttentionCacheLayerMixin)]


# ------------------------------------------------------------------ the mechanisms


def verify_tree(b: Bench, cache, ids: list[int], parents: list[int], depths: list[int]):
    """The project's verify (as generate.speculative_round): the tree forward; a chain without a mask."""
    with hybrid.tree_forward(b.target, parents) as rec:
        if depths == list(range(len(ids))):  # a chain: the cache's causal mask is its tree mask
            logits = b.forward(cache, ids)
        else:
            mask = tree_attention_mask(b.start, parents, torch.float32, "cpu")
            logits = b.forward(cache, ids, torch.tensor([depths]) + b.start, mask)
    logits.argmax(-1).tolist()  # the posterior, as a round reads it
    return logits, rec


def verify_stock(b: Bench, cache, ids: list[int]) -> torch.Tensor:
    logits = b.forward(cache, ids)
    logits.argmax(-1).tolist()
    return logits


def snapshot(cache) -> list[tuple]:
    return [
        (la.conv_states[0].clone(), la.recurrent_states[0].clone(), la.cumulative_length_linear.clone())
        for la in linear_layers(cache)
    ]


def restore_and_rerun(b: Bench, cache, snap: list[tuple], ids: list[int], accepted: int) -> None:
    """``rerun``'s rejection: the recurrent layers back to the snapshot (in place), the attention layers
    cropped to the context, the accepted tokens re-run through the whole target."""
    for layer, (conv, state, count) in zip(linear_layers(cache), snap, strict=True):
        layer.conv_states[0].copy_(conv)
        layer.recurrent_states[0].copy_(state)
        layer.cumulative_length_linear.copy_(count)
    for layer in cache.layers:
        if not isinstance(layer, LinearAttentionCacheLayerMixin):
            layer.crop(-len(ids))
    b.target(
        torch.tensor([ids[: accepted + 1]]),
        position_ids=_positions(b.start, accepted + 1, "cpu"),
        cache=cache,
        use_cache=True,
    )


def chain_round(b: Bench, mechanism: str, k: int, a: int):
    """One chain round of ``mechanism`` from a fresh cache -> (cache after it, the verify's logits,
    seconds of the verify, seconds of the state handling)."""
    ids, cache = b.chain(k), b.fresh()
    snap = None
    if mechanism == "record":  # once per decode, not per round: outside the timing
        cache.activate_past_recording(recurrent_states_to_keep=k)
    t0 = time.perf_counter()
    if mechanism == "rerun":
        snap = snapshot(cache)
    t1 = time.perf_counter()
    if mechanism == "commit":
        logits, rec = verify_tree(b, cache, ids, list(range(-1, k - 1)), list(range(k)))
    else:
        logits = verify_stock(b, cache, ids)
    t2 = time.perf_counter()
    if mechanism == "commit":
        hybrid.commit(cache, rec, b.start, list(range(a + 1)))
    elif mechanism == "record":
        cache.crop(-(k - a - 1))  # crop(0) too: it trims the recorded window back to the kernel's
    elif a + 1 < k:
        restore_and_rerun(b, cache, snap, ids, a)
    t3 = time.perf_counter()
    return cache, logits, t2 - t1, (t1 - t0) + (t3 - t2)


def ddtree(b: Bench, budget: int, depth: int) -> tuple[list[int], list[int], list[int]]:
    """A best-first tree of ``budget`` nodes from random drafter logits -> (ids, parents, depths),
    the bonus first."""
    g = torch.Generator().manual_seed(0)  # the same logits for every B: the smaller tree is in the larger
    logits = 4 * torch.randn((depth, b.target.vocab_size), generator=g)
    tree = DDTree(budget).propose(logits)
    return [b.bonus, *tree.tokens], [-1, *(p + 1 for p in tree.parents)], [0, *tree.depths]


def root_path(parents: list[int], node: int) -> list[int]:
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def tree_round(b: Bench, tree, node: int):
    """A DDTree round accepting the path to ``node`` -> (cache, verify logits, verify s, state s)."""
    ids, parents, depths = tree
    cache = b.fresh()
    t0 = time.perf_counter()
    logits, rec = verify_tree(b, cache, ids, parents, depths)
    t1 = time.perf_counter()
    hybrid.commit(cache, rec, b.start, root_path(parents, node))
    return cache, logits, t1 - t0, time.perf_counter() - t1


def greedy_step(b: Bench) -> float:
    cache = b.fresh()
    t0 = time.perf_counter()
    generate.greedy_step(b.target, cache, b.bonus, b.start)
    return time.perf_counter() - t0


def stock_forward(b: Bench, t: int) -> float:
    ids = (b.chain(len(b.drafts) + 1) * t)[:t]  # t tokens (a tree's count may pass the chain's)
    cache = b.fresh()
    t0 = time.perf_counter()
    verify_stock(b, cache, ids)
    return time.perf_counter() - t0


# ------------------------------------------------------------------ correctness


def check(b: Bench, name: str, cache, logits: torch.Tensor, tokens: list[int], nodes: list[int]) -> float:
    """The cache after a round that committed ``tokens`` (verified at ``nodes``) against plain greedy
    steps over them: windows, states, counts and KV; the verify's logits at those nodes; the logits of
    the next step. Stops the run on a difference -> the largest relative difference."""
    ref = b.fresh()
    steps = [generate_logits(b, ref, tok, b.start + i) for i, tok in enumerate(tokens)]
    pairs = [(logits[nodes], torch.stack(steps))]
    for x, y in zip(cache.layers, ref.layers, strict=True):
        if isinstance(x, LinearAttentionCacheLayerMixin):
            pairs += [(x.conv_states[0], y.conv_states[0]), (x.recurrent_states[0], y.recurrent_states[0])]
            same_count = int(x.cumulative_length_linear) == int(y.cumulative_length_linear)
        else:
            pairs += [(x.keys, y.keys), (x.values, y.values)]
            same_count = True
        if not same_count:
            raise SystemExit(
                f"hybrid_round: {name}: a recurrent layer's token count differs from plain steps'"
            )
    worst = largest_diff(name, pairs)  # before the next step: it updates some states in place
    n = b.start + len(tokens)
    return max(
        worst, largest_diff(name, [(generate_logits(b, cache, NEXT, n), generate_logits(b, ref, NEXT, n))])
    )


def largest_diff(name: str, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """The largest difference of the pairs, relative to the largest magnitude of the reference tensor
    (at least 1): wider random targets have larger activations and float32 rounding grows with them."""
    worst = 0.0
    for got, want in pairs:
        diff = (
            (got - want).abs().max().item() / max(1.0, want.abs().max().item())
            if got.shape == want.shape
            else 1
        )
        if not diff <= TOL:  # a NaN fails too
            raise SystemExit(
                f"hybrid_round: {name}: the cache after the round differs from plain greedy steps' over "
                f"the same tokens (relative difference {diff:.1e}, tolerance {TOL}): a wrong mechanism is "
                "not timed"
            )
        worst = max(worst, diff)
    return worst


def generate_logits(b: Bench, cache, token: int, position: int) -> torch.Tensor:
    out = b.target(
        torch.tensor([[token]]), position_ids=torch.tensor([[position]]), cache=cache, use_cache=True
    )
    return b.target.head(out.hidden)[0, -1]


def check_all(b: Bench, chains, trees) -> dict:
    worst: dict[str, float] = {}
    count = 0
    for k, accepts in chains.items():
        for a in accepts:
            for mech in ("commit", "record", "rerun"):
                cache, logits, _, _ = chain_round(b, mech, k, a)
                d = check(b, f"{mech} K={k} a={a}", cache, logits, b.chain(k)[: a + 1], list(range(a + 1)))
                worst[mech], count = max(worst.get(mech, 0.0), d), count + 1
    for budget, (tree, nodes) in trees.items():
        ids, parents, _ = tree
        for node in nodes:
            path = root_path(parents, node)
            cache, logits, _, _ = tree_round(b, tree, node)
            d = check(b, f"commit B={budget} node {node}", cache, logits, [ids[i] for i in path], path)
            worst["commit_tree"], count = max(worst.get("commit_tree", 0.0), d), count + 1
    return {
        "passed": count,
        "tolerance": TOL,
        "max_rel_diff": {m: float(f"{d:.2e}") for m, d in worst.items()},
    }


# ------------------------------------------------------------------ timing


def run_target(args, hidden: int) -> tuple[list[dict], dict]:
    b = Bench(args, hidden)
    chains = {k: sorted({0, min(2, k - 1), k - 1}) for k in args.chain_tokens}
    trees = {}
    for budget in args.budgets:
        tree = ddtree(b, budget, args.tree_depth)
        depths = tree[2]
        pick = sorted({0, min(2, max(depths)), max(depths)})
        trees[budget] = (tree, [depths.index(d) for d in pick])  # the first node of each depth
    checks = check_all(b, chains, trees)
    parts = {}
    for k, accepts in chains.items():
        parts[("stock", k)] = lambda k=k: stock_forward(b, k)
        for mech in ("commit", "record", "rerun"):
            parts[(mech, k, "verify")] = lambda m=mech, k=k: chain_round(b, m, k, k - 1)[2]
            for a in accepts:
                parts[(mech, k, a)] = lambda m=mech, k=k, a=a: chain_round(b, m, k, a)[3]
    for budget, (tree, nodes) in trees.items():
        parts[("stock", budget + 1)] = lambda t=budget + 1: stock_forward(b, t)
        parts[("tree", budget, "verify")] = lambda tr=tree: tree_round(b, tr, 0)[2]
        for node in nodes:
            parts[("tree", budget, node)] = lambda tr=tree, n=node: tree_round(b, tr, n)[3]
    med, step = paired_ratios(b, parts, args.repeats)
    rows = chain_rows(hidden, chains, med) + tree_rows(hidden, trees, med)
    layers = b.target.model.config.layer_types
    summary = {
        "hidden_size": hidden,
        "layers": {t: layers.count(t) for t in sorted(set(layers))},
        "greedy_step_ms": round(step * 1e3, 3),
        "checks": checks,
        "rounds": {row["round"]: {k: row[k] for k in ("verify", "state", "state_share")} for row in rows},
    }
    print_table(summary, rows)
    return rows, summary


def paired_ratios(b: Bench, parts: dict, repeats: int) -> tuple[dict, float]:
    """Each part right after a greedy step, in a shuffled order each repetition (the first one warms
    up) -> (the median ratio of each part to its step, the median greedy step in seconds)."""
    ratios: dict = {name: [] for name in parts}
    steps = []
    order = random.Random(0)
    for rep in range(repeats + 1):
        names = list(parts)
        order.shuffle(names)
        for name in names:
            g = greedy_step(b)
            t = parts[name]()
            if rep:
                ratios[name].append(t / g)
                steps.append(g)
    return {name: median(v) for name, v in ratios.items()}, median(steps)


def median(v: list[float]) -> float:
    return sorted(v)[len(v) // 2]


def row(hidden, name, mechanism, verified, accepted, verify, state, stock) -> dict:
    return {
        "hidden_size": hidden,
        "round": name,
        "mechanism": mechanism,
        "tokens_verified": verified,
        "accepted_drafts": accepted,
        "verify": round(verify, 3),
        "state": round(state, 3),
        "total": round(verify + state, 3),
        "state_share": round(state / (verify + state), 4),
        "verify_minus_stock": round(verify - stock, 3),
    }


def chain_rows(hidden: int, chains: dict, med: dict) -> list[dict]:
    out = []
    for k, accepts in chains.items():
        for mech in ("commit", "record", "rerun"):
            for a in accepts:
                name = f"chain K={k} {mech} a={a}"
                out.append(
                    row(
                        hidden,
                        name,
                        mech,
                        k,
                        a,
                        med[(mech, k, "verify")],
                        med[(mech, k, a)],
                        med[("stock", k)],
                    )
                )
    return out


def tree_rows(hidden: int, trees: dict, med: dict) -> list[dict]:
    out = []
    for budget, ((_, _, depths), nodes) in trees.items():
        for node in nodes:
            name = f"ddtree B={budget} commit a={depths[node]}"
            verify, stock = med[("tree", budget, "verify")], med[("stock", budget + 1)]
            out.append(
                row(
                    hidden,
                    name,
                    "commit",
                    budget + 1,
                    depths[node],
                    verify,
                    med[("tree", budget, node)],
                    stock,
                )
            )
    return out


def print_table(summary: dict, rows: list[dict]) -> None:
    c = summary["checks"]
    print(
        f"hidden {summary['hidden_size']}, layers {summary['layers']}, greedy step "
        f"{summary['greedy_step_ms']} ms (median of the paired steps); checks passed {c['passed']}, "
        f"largest relative difference {c['max_rel_diff']}"
    )
    head = ("verify", "state", "total", "share")
    print(
        f"{'round (ratios to one greedy step)':>34} " + " ".join(f"{h:>7}" for h in head) + f" {'v-stock':>8}"
    )
    for r in rows:
        print(
            f"{r['round']:>34} {r['verify']:>7.3f} {r['state']:>7.3f} {r['total']:>7.3f} "
            f"{r['state_share']:>7.1%} {r['verify_minus_stock']:>+8.3f}"
        )


# ------------------------------------------------------------------ on paper


def paper(card: str, chain_tokens: list[int], budgets: list[int], context: int) -> dict:
    """State handling per round on ``card`` as shares of one greedy step (bf16 weights read once; the
    step's FLOPs 2 per weight), from the architecture built on the meta device."""
    model = HFPretrained(path=card, card=card, dtype="bfloat16", meta=True).load().model
    cfg = model.config
    embed = model.get_input_embeddings().weight.numel()  # a step reads one row of it
    weights = sum(p.numel() for p in model.parameters()) - embed
    step_bytes, step_flops = 2 * weights, 2 * weights
    kinds = cfg.layer_types
    n_lin, n_att = kinds.count("linear_attention"), kinds.count("full_attention")
    h, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    elems = h * dk * dv  # one layer's recurrent state
    s = 4 * elems * n_lin  # all layers' states, float32 (the stock kernels' dtype)
    kv_token = n_att * 2 * cfg.num_key_value_heads * cfg.head_dim * 2  # bf16 K and V, all attention layers

    def share(nbytes: float, flops: float) -> dict:
        return {"bytes_GB": round(nbytes / 1e9, 3), "bytes_share": round(nbytes / step_bytes, 5),
                "flops_G": round(flops / 1e9, 3), "flops_share": round(flops / step_flops, 5)}  # fmt: skip

    def commit_cost(t: int) -> dict:  # read S0 and k, v_new of the T tokens; write S_n
        chunk = 4 * t * h * (dk + dv) * n_lin
        return share(2 * s + chunk, 2 * elems * (t + 1) * n_lin)

    rounds = {}
    for k in chain_tokens:
        for a in sorted({0, min(2, k - 1), k - 1}):
            rerun_bytes = 2 * s + (2 * s + step_bytes if a + 1 < k else 0)  # snapshot; restore + re-run
            rounds[f"chain K={k} a={a}"] = {
                "commit": commit_cost(k),
                "record": share(2 * k * s, 0),  # each token's state cloned (read + write) during the verify
                "rerun": share(rerun_bytes, (a + 1) * step_flops if a + 1 < k else 0),
            }
    for budget in budgets:
        t = budget + 1
        rounds[f"ddtree B={budget}"] = {
            "commit": commit_cost(t),
            "per_node_states": share(2 * t * s, 0),  # each node reads its parent's state, writes its own
        }
    out = {
        "card": card,
        "params_B": round((weights + embed) / 1e9, 3),
        "greedy_step_GB": round(step_bytes / 1e9, 2),
        "gdn_layers": n_lin,
        "attention_layers": n_att,
        "state_MB_per_layer": round(4 * elems / 1e6, 3),
        "states_MB": round(s / 1e6, 1),
        # The attention KV after a round (target/frozen.py keep_layer): a chain's prefix is already in
        # place (a slice, no copy); a tree path's entries move next to the committed ones (read + write
        # |path| tokens); copying every position, as the commit did before, costs the context's KV.
        "kv_compaction": {
            "path_tokens": max(chain_tokens),
            "tree_path": share(2 * max(chain_tokens) * kv_token, 0),
            "context": context,
            "all_positions": share(2 * context * kv_token, 0),
        },
        "rounds": rounds,
        "counts": PAPER_COUNTS,
    }
    print_paper(out)
    return out


def print_paper(p: dict) -> None:
    print(
        f"\non paper, {p['card']}: {p['params_B']} B parameters; a greedy step reads "
        f"{p['greedy_step_GB']} GB of bf16 weights (the embedding table aside); {p['gdn_layers']} "
        f"Gated-DeltaNet layers of {p['state_MB_per_layer']} MB float32 state ({p['states_MB']} MB in all), "
        f"{p['attention_layers']} attention layers"
    )
    head = f"{'GB':>8} {'of a step':>10} {'GFLOP':>8} {'of a step':>10}"
    print(f"{'state handling per round':>26} {'mechanism':>16} {head}")
    for name, mechs in p["rounds"].items():
        for mech, c in mechs.items():
            print(
                f"{name:>26} {mech:>16} {c['bytes_GB']:>8.3f} {c['bytes_share']:>10.2%} "
                f"{c['flops_G']:>8.2f} {c['flops_share']:>10.2%}"
            )
    for mech, what in p["counts"].items():
        print(f"  {mech}: {what}")
    kv = p["kv_compaction"]
    path, every = kv["tree_path"], kv["all_positions"]
    print(
        f"attention KV after a round: a chain's prefix is cut in place (0 bytes); a tree path of "
        f"{kv['path_tokens']} tokens moves {path['bytes_GB']} GB ({path['bytes_share']:.3%} of a step); "
        f"copying all positions of a {kv['context']}-token context would move {every['bytes_GB']} GB "
        f"({every['bytes_share']:.2%})"
    )


if __name__ == "__main__":
    main()
