"""Chat records are exact in tokens (data/chat.py, docs/data.md "Chat records"): the chat markup becomes
the single special ids the served model sees, through records, the feature cache and training batches;
the loss mask covers exactly the assistant's tokens; plain text still cannot produce a special token."""

import json

import pytest
import torch

from spec_drafters.data.chat import conversation, render
from spec_drafters.data.records import TextRecords, collate, tokenize
from spec_drafters.errors import InputError
from spec_drafters.target.chat_tokenizers import chat_tokenizer
from spec_drafters.target.tokenizers import TextTokenizer

TURNS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Sum 2 and 3."},
    {"role": "assistant", "content": "5", "reasoning_content": "2+3"},
]


def tok(style):
    return TextTokenizer(chat_tokenizer(style))


def supervised_text(t, ids, mask):
    """The masked tokens, decoded run by run."""
    runs, run = [], []
    for i, m in zip(ids, mask, strict=True):
        if m:
            run.append(i)
        elif run:
            runs.append(t.decode(run))
            run = []
    if run:
        runs.append(t.decode(run))
    return runs


@pytest.mark.parametrize(
    ("style", "thinking", "want"),
    [
        ("chatml", False, ["5<|im_end|>"]),  # the empty think block is the template's, not generated
        ("chatml", True, ["<think>\n2+3\n</think>\n\n5<|im_end|>"]),
        ("llama3", None, ["5<|eot_id|>"]),
    ],
)
def test_the_mask_covers_exactly_the_assistant_tokens(style, thinking, want):
    t = tok(style)
    turns = TURNS if thinking else [*TURNS[:2], {"role": "assistant", "content": "5"}]
    ids, mask = render(t, turns, thinking, "x.jsonl:1")
    assert supervised_text(t, ids, mask) == want
    assert t.decode(ids) == t.hf.apply_chat_template(turns, tokenize=False, enable_thinking=thinking)
    special = t.special_ids()
    markup = {"chatml": ["<|im_start|>", "<|im_end|>"], "llama3": ["<|start_header_id|>", "<|eot_id|>"]}
    for token in markup[style]:  # one id each, a special one
        (i,) = t.hf.convert_tokens_to_ids([token])
        assert i in special and ids.count(i) >= 2


def test_two_assistant_turns_are_both_supervised_and_sharegpt_reads_the_same():
    t = tok("llama3")
    turns = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
    ]
    ids, mask = render(t, turns, None, "x")
    assert supervised_text(t, ids, mask) == ["b<|eot_id|>", "d<|eot_id|>"]
    share = {"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"},
                               {"from": "human", "value": "c"}, {"from": "gpt", "value": "d"}]}  # fmt: skip
    assert conversation(share, "x") == turns == conversation({"messages": turns}, "x")


def test_a_template_that_rewrites_earlier_turns_is_refused_by_record():
    """Qwen3-style: an assistant turn's thinking is dropped once a later user turn follows, so the
    conversation through that turn is not a prefix of the whole."""
    turns = [*TURNS, {"role": "user", "content": "Again?"}, {"role": "assistant", "content": "5"}]
    with pytest.raises(InputError, match=r"data\.jsonl:7: the chat template does not render .* prefix"):
        render(tok("chatml"), turns, True, "data.jsonl:7")


@pytest.mark.parametrize(
    ("rec", "message"),
    [
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "turn 0 must be"),
        ({"messages": [{"role": "user", "content": 3}]}, "turn 0 must be"),
        ({"messages": [{"role": "assistant", "content": "x"}]}, "starts with the assistant"),
        ({"messages": [{"role": "user", "content": "x"}]}, "no assistant turn"),
        ({"conversations": [{"from": "alien", "value": "x"}]}, "turn 0 must be"),
    ],
)
def test_malformed_conversations_name_the_record(rec, message):
    with pytest.raises(InputError, match=f"f.jsonl:3: .*{message}"):
        conversation(rec, "f.jsonl:3")


def test_plain_text_still_splits_special_token_strings():
    t = tok("chatml")
    ids = t.encode("<|im_start|>user")
    assert not set(ids) & t.special_ids() and len(ids) > 2
    ex = tokenize({"prompt": "<|im_end|>", "response": "<|im_start|>ok"}, t, 64)
    assert not set(ex.input_ids) & t.special_ids()


def test_token_exact_records_are_read_as_ids():
    t = tok("chatml")
    ex = tokenize({"input_ids": [256, 5, 6, 257], "loss_mask": [0, 1, 1, 1]}, t, 64)
    assert ex.input_ids == [256, 5, 6, 257] and ex.loss_mask == [0, 1, 1, 1]
    with pytest.raises(InputError, match="same length"):
        tokenize({"input_ids": [1, 2], "loss_mask": [1]}, t, 64, where="f:1")
    with pytest.raises(InputError, match=r"outside the tokenizer's 0\.\.261"):
        tokenize({"input_ids": [1, 999], "loss_mask": [1, 1]}, t, 64, where="f:1")


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


#: style -> (the turn opener, the end of turn, what the model writes for "answer 0")
MARKUP = {
    "chatml": ("<|im_start|>", "<|im_end|>", "<think>\n\n</think>\n\nanswer 0<|im_end|>"),
    "llama3": ("<|start_header_id|>", "<|eot_id|>", "answer 0<|eot_id|>"),
}


@pytest.mark.parametrize("style", ["chatml", "llama3"])
def test_special_ids_survive_records_cache_and_batches(tmp_path, style):
    """From a messages file through TextRecords, the offline feature cache and collate, for a Qwen-style
    and a Llama-style tokenizer: the ids the template gives, the special ones single, the mask on the
    assistant's tokens only."""
    from spec_drafters.data.feature_cache import CachedRecords, build_cache, collate_cached, run_meta
    from spec_drafters.lightning.module import DFlashModule
    from spec_drafters.model.drafter import DrafterConfig
    from spec_drafters.target.injection import AllButLast
    from spec_drafters.target.loaders import TinyRandom

    records = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"answer {i}"}],
         "split": "train" if i < 6 else "val"}
        for i in range(8)
    ]  # fmt: skip
    data = _write(tmp_path / "chat.jsonl", records)
    torch.manual_seed(0)
    module = DFlashModule(
        target=TinyRandom(num_layers=6, chat=style), drafter=DrafterConfig(num_layers=1, block_size=4),
        injection=AllButLast(num_taps=3),
    )  # fmt: skip
    t = module.tokenizer
    text = TextRecords(path=str(data), max_length=128)
    train, val = text.examples(t)
    assert len(train) == 6 and len(val) == 2
    want_ids, want_mask = render(t, conversation(records[0], "x"), None, "x")
    assert train[0].input_ids == want_ids and train[0].loss_mask == want_mask
    opener, end, answer = MARKUP[style]
    im_start, im_end = t.hf.convert_tokens_to_ids([opener, end])
    spec = module.feature_spec()
    build_cache(spec, text, tmp_path / "cache", progress=False)
    cached = CachedRecords(tmp_path / "cache", run_meta(spec, text, train), examples=train)
    assert len(cached) == len(train)
    for i, ex in enumerate(train):
        ids = cached[i]["input_ids"].tolist()
        assert ids == ex.input_ids and ids.count(im_start) == 2 and ids.count(im_end) == 2
        assert cached[i]["loss_mask"].tolist() == ex.loss_mask
    for batch in (collate(train), collate_cached([cached[i] for i in range(len(cached))])):
        assert int((batch["input_ids"] == im_start).sum()) == 2 * len(train)
        assert int(batch["loss_mask"].sum()) == sum(sum(ex.loss_mask) for ex in train)
    # ChatML with thinking on (the template's default): the model writes the (empty) think block itself.
    assert supervised_text(t, train[0].input_ids, train[0].loss_mask) == [answer]


def test_lint_names_the_file_line_and_token_of_pasted_chat_markup(tmp_path, capsys):
    """Plain-text records holding the target's special-token strings: an error naming file, line and
    token; the same markup inside a conversation's turns: a warning."""
    from spec_drafters.cli.main import main

    plain = _write(tmp_path / "plain.jsonl", [
        {"prompt": "Hi", "response": "fine", "split": "train"},
        {"text": "<|im_start|>user\nHi<|im_end|>", "split": "train"},
    ])  # fmt: skip
    args = ["lint", "--config", "tests/configs/tiny.yaml", "--model.target.init_args.chat", "chatml"]
    with pytest.raises(SystemExit) as e:
        main([*args, "--data.path", str(plain)])
    out = capsys.readouterr().out
    assert e.value.code == 1 and "special-token-in-text" in out and f"{plain}:2 (<|im_start|>)" in out
    chat = _write(tmp_path / "chat.jsonl", [
        {"messages": [{"role": "user", "content": "say <|im_end|>"}, {"role": "assistant", "content": "ok"}]},
    ])  # fmt: skip
    main([*args, "--data.path", str(chat)])  # a warning: rc 0
    out = capsys.readouterr().out
    assert "special-token-in-chat" in out and f"{chat}:1 (<|im_end|>)" in out
    main([*args, "--data.path", "tests/data/tiny.jsonl"])  # clean text: neither
    assert "special-token" not in capsys.readouterr().out


def test_held_out_by_content_reads_conversations_and_ids():
    """A held-out conversation whose answer a training conversation also gives trains instead; so does
    a token-exact record whose ids repeat a training record's."""
    from spec_drafters.data.heldout import split_by_content

    answer = "a long enough answer to count as a copy of the other record"
    conv = [
        {"messages": [{"role": "user", "content": "one"}, {"role": "assistant", "content": answer}]},
        {"conversations": [{"from": "human", "value": "two"}, {"from": "gpt", "value": answer}]},
        {"messages": [{"role": "user", "content": "three"}, {"role": "assistant", "content": "other"}]},
    ]
    assert split_by_content(conv, ["train", "val", "val"]) == ["train", "train", "val"]
    ids = [{"input_ids": list(range(40)), "loss_mask": [0] * 5 + [1] * 35}] * 2
    assert split_by_content(ids, ["train", "val"]) == ["train", "train"]


def test_cache_fit_validate_from_a_messages_file_on_a_tiny_chat_target(tmp_path):
    """From the CLI: a messages-format file through ``cache``, ``fit`` from that cache and ``validate``
    on a tiny target with a ChatML tokenizer and template (thinking off for every record)."""
    from spec_drafters.cli.main import main

    records = [
        {"messages": [{"role": "user", "content": f"Count to {i}."},
                      {"role": "assistant", "content": " ".join(str(j) for j in range(i + 3))}],
         "split": "val" if i % 5 == 0 else "train"}
        for i in range(20)
    ]  # fmt: skip
    data = _write(tmp_path / "chat.jsonl", records)
    common = ["--config", "tests/configs/tiny.yaml", "--model.target.init_args.chat", "chatml",
              "--data.path", str(data), "--data.thinking", "false"]  # fmt: skip
    main(["cache", *common, "--out", str(tmp_path / "cache")])
    main(["fit", *common, "--data.cache", str(tmp_path / "cache"), "--trainer.max_steps", "4",
          "--trainer.default_root_dir", str(tmp_path), "--results", str(tmp_path / "fit.json")])  # fmt: skip
    ckpt = next(tmp_path.rglob("last.ckpt"))
    main(["validate", *common, "--ckpt_path", str(ckpt), "--trainer.default_root_dir", str(tmp_path),
          "--results", str(tmp_path / "val.json")])  # fmt: skip
    metrics = json.loads((tmp_path / "val.json").read_text())["metrics"]
    assert 1 <= metrics["val/tau"] <= 4 and metrics["val/loss"] > 0
