"""``spec-drafters regenerate`` (data/regenerate.py, decode/engines.py, docs/regenerate.md): prompts in
the common formats, dedupe and decontamination, token-exact records from the target's own path or an
OpenAI-compatible server, resumable parts, and the records through cache, fit and validate."""

import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from spec_drafters.cli.main import main
from spec_drafters.data import regenerate as rg
from spec_drafters.errors import InputError

TINY = ["--config", "tests/configs/tiny.yaml", "--model.target.init_args.chat", "chatml"]


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def prompts(tmp_path, n=10):
    recs = []
    for i in range(n):
        if i % 3 == 0:
            turns = [{"role": "user", "content": f"List {i} numbers."},
                     {"role": "assistant", "content": "the dataset's own answer"}]  # fmt: skip
            recs.append({"messages": turns})
        elif i % 3 == 1:
            recs.append({"conversations": [{"from": "human", "value": f"Say hi {i} times."}]})
        else:
            recs.append({"prompt": f"Write the word {i}."})
    return write(tmp_path / "prompts.jsonl", recs)


def read_corpus(out):
    with gzip.open(out / "corpus.jsonl.gz", "rt") as fh:
        return [json.loads(line) for line in fh]


def test_prompt_formats_dedupe_and_decontamination(tmp_path):
    path = write(tmp_path / "p.jsonl", [
        {"messages": [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "old"}]},
        {"conversations": [{"from": "human", "value": "hello,   THERE"}]},  # a duplicate, normalised
        {"prompt": "Mention HumanEval: a benchmark of Python problems."},
        {"text": "from typing import List\n\n\ndef has_close_elements(numbers: List[float], "
                 "threshold: float) -> bool:\n    \"\"\" Check if in given list of numbers, are any two "
                 "numbers closer to each other than\n    given threshold.\n"},  # HumanEval/0 pasted
    ])  # fmt: skip
    items = rg.read_prompts([path])
    assert [it.turns for it in items[:2]] == [[{"role": "user", "content": "Hello there"}],
                                              [{"role": "user", "content": "hello,   THERE"}]]  # fmt: skip
    kept, dupes = rg.dedupe(items)
    assert dupes == 1 and len(kept) == 3
    from spec_drafters.data.prompts import HumanEvalPrompts

    clean, removed = rg.decontaminate(kept, {"humaneval": HumanEvalPrompts().prompts()})
    assert removed == {"humaneval": 1} and [it.source.endswith(":4") for it in clean] == [False, False]
    with pytest.raises(InputError, match=r"p2\.jsonl:1: a prompt record needs"):
        rg.read_prompts([write(tmp_path / "p2.jsonl", [{"question": "x"}])])
    with pytest.raises(InputError, match="the last turn to answer is 'system'"):
        rg.read_prompts([write(tmp_path / "p3.jsonl", [{"messages": [{"role": "system", "content": "x"}]}])])


def test_parquet_and_json_prompt_files_read_as_jsonl(tmp_path):
    """The same prompts as Parquet (columns a row lacks are null there), a JSON list and a folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    recs = [
        {"messages": [{"role": "user", "content": "One?"}, {"role": "assistant", "content": "1"}]},
        {"prompt": "Two?"},
    ]
    jsonl = rg.read_prompts([write(tmp_path / "p.jsonl", recs)])
    table = pa.table({"messages": [recs[0]["messages"], None], "prompt": [None, "Two?"]})
    pq.write_table(table, tmp_path / "p.parquet")
    (tmp_path / "p.json").write_text(json.dumps(recs))
    for path in ("p.parquet", "p.json"):
        got = rg.read_prompts([str(tmp_path / path)])
        assert [(i.id, i.turns) for i in got] == [(i.id, i.turns) for i in jsonl], path
    assert len(rg.read_prompts([str(tmp_path)])) == 6  # the folder: all three files


HYBRID = ["--config", "tests/configs/tiny_hybrid.yaml", "--model.target.init_args.chat", "chatml"]


@pytest.mark.parametrize("target", [TINY, HYBRID], ids=["qwen3", "qwen3_5_hybrid"])
def test_regenerate_writes_token_exact_records_that_train(tmp_path, target):
    """regenerate -> cache -> fit -> validate from the CLI, on a tiny chat target (plain and the
    Gated-DeltaNet hybrid): every record's ids are the rendered prompt and the target's own greedy
    answer, the mask on the answer."""
    from spec_drafters.cli.setup_args import load_setup
    from spec_drafters.decode.generate import greedy_generate

    out = tmp_path / "regen"
    main(["regenerate", "--prompts", prompts(tmp_path), "--out", str(out), "--max_tokens", "24",
          "--part_size", "4", "--val_fraction", "0.3", "--thinking", "off", "--no_progress",
          *target])  # fmt: skip
    records = read_corpus(out)
    assert len(records) == 10 and {r["split"] for r in records} == {"train", "val"}
    module = load_setup(target, quiet=True)
    tok = module.tokenizer
    for r in records[:3]:
        turns = r["messages"][:-1]
        prompt = tok.chat_ids(turns, add_generation_prompt=True, enable_thinking=False)
        n = len(prompt)
        assert r["input_ids"][:n] == prompt and r["loss_mask"] == [0] * n + [1] * (len(r["input_ids"]) - n)
        want = greedy_generate(module.target, prompt, 24, module.card.eos_token_ids).tokens
        assert r["input_ids"][n:] == want
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "done" and manifest["prompts"]["kept"] == 10
    assert manifest["calls"][0]["tokens"] == sum(sum(r["loss_mask"]) for r in records)
    data = ["--data.path", str(out / "corpus.jsonl.gz")]
    main(["cache", *target, *data, "--out", str(tmp_path / "cache")])
    main(["fit", *target, *data, "--data.cache", str(tmp_path / "cache"), "--trainer.max_steps", "3",
          "--trainer.default_root_dir", str(tmp_path)])  # fmt: skip
    main(["validate", *target, *data, "--ckpt_path", str(next(tmp_path.rglob("last.ckpt"))),
          "--trainer.default_root_dir", str(tmp_path), "--results", str(tmp_path / "v.json")])  # fmt: skip
    assert json.loads((tmp_path / "v.json").read_text())["metrics"]["val/tau"] >= 1


def test_a_killed_regenerate_resumes_to_the_same_bytes(tmp_path, monkeypatch):
    from spec_drafters.decode import engines

    args = ["--prompts", prompts(tmp_path), "--max_tokens", "12", "--part_size", "3", "--no_progress",
            "--temperature", "0.8", "--seed", "5", *TINY]  # fmt: skip
    main(["regenerate", "--out", str(tmp_path / "whole"), *args])
    real, calls = engines.InProcess.generate, []

    def dies_on_the_third_part(self, prompts, ids, settings):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the run is killed here
        return real(self, prompts, ids, settings)

    monkeypatch.setattr(engines.InProcess, "generate", dies_on_the_third_part)
    with pytest.raises(KeyboardInterrupt):
        main(["regenerate", "--out", str(tmp_path / "killed"), *args])
    assert len(list((tmp_path / "killed" / "parts").glob("part-*.jsonl.gz"))) == 2
    monkeypatch.setattr(engines.InProcess, "generate", real)
    main(["regenerate", "--out", str(tmp_path / "killed"), *args])
    whole = (tmp_path / "whole" / "corpus.jsonl.gz").read_bytes()
    assert (tmp_path / "killed" / "corpus.jsonl.gz").read_bytes() == whole
    manifest = json.loads((tmp_path / "killed" / "manifest.json").read_text())
    assert [c["parts_answered"] for c in manifest["calls"]] == [2]  # the rerun answered only what was left
    with pytest.raises(SystemExit, match="holds a regeneration with other settings"):
        main(["regenerate", "--out", str(tmp_path / "killed"), *args, "--max_tokens", "13"])


class FakeServer(BaseHTTPRequestHandler):
    """An OpenAI-compatible server in the test: the tiny target answers /v1/completions on its own
    decoding path, as vLLM returns ids (``token_ids``)."""

    module = None
    served = "tiny"

    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(200, {"data": [{"id": self.served}]})

    def do_POST(self):
        from spec_drafters.decode.generate import sample_generate
        from spec_drafters.decode.sampling import Sampling

        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        m = self.module
        if self.path == "/tokenize":
            return self._send(200, {"tokens": m.tokenizer.encode(body["prompt"])})
        s = Sampling(body["temperature"], body["top_p"], body["seed"])
        with torch.no_grad():
            ids = sample_generate(
                m.target, body["prompt"], body["max_tokens"], m.card.eos_token_ids, s
            ).tokens
        done = ids[-1] in m.card.eos_token_ids
        self._send(200, {"choices": [{"token_ids": ids, "finish_reason": "stop" if done else "length"}]})

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    from spec_drafters.cli.setup_args import load_setup

    FakeServer.module = load_setup(TINY, quiet=True)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_the_openai_engine_writes_what_the_in_process_engine_writes(tmp_path, server):
    args = ["--prompts", prompts(tmp_path, 6), "--max_tokens", "16", "--no_progress", *TINY]
    main(["regenerate", "--out", str(tmp_path / "local"), *args])
    main(["regenerate", "--out", str(tmp_path / "served"), "--engine", "openai", "--base_url", server,
          "--concurrency", "3", *args])  # fmt: skip
    local, served = read_corpus(tmp_path / "local"), read_corpus(tmp_path / "served")
    assert [r["input_ids"] for r in served] == [r["input_ids"] for r in local]
    engine = json.loads((tmp_path / "served" / "manifest.json").read_text())["engine"]
    assert engine == {"engine": "openai", "base_url": server + "/v1", "model": "tiny"}


def test_the_openai_engine_refuses_a_wrong_or_missing_server(tmp_path, server):
    args = ["--prompts", prompts(tmp_path, 2), "--no_progress", "--engine", "openai", *TINY]
    with pytest.raises(SystemExit, match=r"serves \['tiny'\], not 'other'"):
        main(
            [
                "regenerate",
                "--out",
                str(tmp_path / "a"),
                *args,
                "--base_url",
                server,
                "--served_model",
                "other",
            ]
        )
    with pytest.raises(SystemExit, match=r"no answer after 1 attempt.*is the server running"):
        main(["regenerate", "--out", str(tmp_path / "b"), *args, "--base_url", "http://127.0.0.1:9",
              "--retries", "0"])  # fmt: skip


def test_batched_in_process_answers_equal_one_at_a_time(tmp_path):
    """--batch_size 4 (transformers' batched generate, left-padded) writes the same records as the
    one-prompt path on the tiny float64 target; sampling and hybrid targets refuse it."""
    args = ["--prompts", prompts(tmp_path, 9), "--max_tokens", "20", "--no_progress", *TINY,
            "--model.target.init_args.dtype", "float64"]  # fmt: skip
    main(["regenerate", "--out", str(tmp_path / "one"), *args])
    main(["regenerate", "--out", str(tmp_path / "batched"), *args, "--batch_size", "4"])
    one, batched = read_corpus(tmp_path / "one"), read_corpus(tmp_path / "batched")
    assert [r["input_ids"] for r in batched] == [r["input_ids"] for r in one]
    assert [r["finish_reason"] for r in batched] == [r["finish_reason"] for r in one]
    with pytest.raises(SystemExit, match="for greedy answers"):
        main(["regenerate", "--out", str(tmp_path / "s"), *args, "--batch_size", "4", "--temperature", "0.5"])
    hybrid = ["--prompts", prompts(tmp_path, 2), "--no_progress", *HYBRID, "--batch_size", "2"]
    with pytest.raises(SystemExit, match="pads prompts, which a Gated-DeltaNet"):
        main(["regenerate", "--out", str(tmp_path / "h"), *hybrid])
