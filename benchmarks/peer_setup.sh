#!/usr/bin/env bash
# Build .peer-venv: an isolated virtual environment holding the peer library `speculators`
# (vllm-project/speculators), used only by benchmarks/peer_speculators.py to time its DFlash
# training step next to ours. It is never a dependency of spec-drafters.
#
#   bash benchmarks/peer_setup.sh            # idempotent: skips when the stamp file is current
#   PEER_FORCE=1 bash benchmarks/peer_setup.sh   # rebuild from scratch
#
# Install plan (and why):
#   1. torch==2.13.0 first, alone: here that resolves to the local CPU wheel; an unpinned resolve
#      (speculators declares torch<=2.14.1,>=2.9.0) would pull a multi-GB CUDA build. A constraints
#      file keeps every later install from replacing it.
#   2. speculators==0.9.0 with --no-deps, then every dependency it declares EXCEPT torchvision and
#      torchaudio (same version bounds as its metadata). Those two are never imported by speculators
#      (model, training or CLI code); their PyPI wheels are built against one specific CUDA torch
#      release and would either replace the CPU torch or fail to load against it. pip therefore
#      reports "speculators 0.9.0 requires torchaudio/torchvision, which is not installed": expected.
#      The dataset/serving deps (datasets, openai, aiohttp, httpx, hs-connectors) are not used by
#      the benchmark itself but `import speculators` imports them (models/eagle3 -> train/data.py),
#      so they are installed; no vllm is needed (speculators does not declare it).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PEER_VENV:-$ROOT/.peer-venv}"
PYTHON="${PYTHON:-python3}"
SPECULATORS_VERSION="0.9.0"
TORCH_VERSION="2.13.0"
# speculators 0.9.0's declared dependencies minus torch (installed first), torchvision, torchaudio.
MIN_DEPS=(
  "aiohttp"
  "click"
  "datasets>=4.0.0,<=5.1.0"
  "httpx"
  "huggingface-hub"
  "loguru>=0.7.2,<=0.7.3"
  "numpy>=2.0.0,<=2.5.4"
  "openai>=2.0.0"
  "protobuf"
  "psutil"
  "pydantic>=2.0.0"
  "pydantic-settings>=2.0.0"
  "rich"
  "safetensors"
  "tqdm>=4.66.3,<=4.70.1"
  "transformers>=5.0.0,<=5.19.0"
  "typer>=0.12.0"
  "hs-connectors==0.9.0"
)
STAMP="$VENV/.peer-installed"
STAMP_CONTENT="speculators==$SPECULATORS_VERSION torch==$TORCH_VERSION deps=${MIN_DEPS[*]}"

if [[ -z "${PEER_FORCE:-}" && -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_CONTENT" ]]; then
  echo "peer venv up to date: $VENV ($STAMP_CONTENT)"
  exit 0
fi

if [[ -n "${PEER_FORCE:-}" ]]; then
  rm -rf "$VENV"
fi

echo "== creating $VENV"
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip

CONSTRAINTS="$VENV/peer-constraints.txt"
cat > "$CONSTRAINTS" <<EOF
torch==$TORCH_VERSION
EOF

echo "== installing torch==$TORCH_VERSION (first, so nothing can replace it)"
"${PIP[@]}" install -q -c "$CONSTRAINTS" "torch==$TORCH_VERSION"

echo "== installing speculators==$SPECULATORS_VERSION (--no-deps), then its deps except torchvision/torchaudio"
"${PIP[@]}" install -q -c "$CONSTRAINTS" --no-deps "speculators==$SPECULATORS_VERSION"
"${PIP[@]}" install -q -c "$CONSTRAINTS" "${MIN_DEPS[@]}"

echo "== checking"
"$VENV/bin/python" - <<'EOF'
import torch, transformers, speculators
from importlib.metadata import version
from speculators.models.dflash import DFlashDraftModel  # noqa: F401
print(f"torch {torch.__version__} (cuda build: {torch.version.cuda}), "
      f"transformers {transformers.__version__}, speculators {version('speculators')}")
EOF

echo "== installed packages in $VENV"
"${PIP[@]}" list --format=freeze

echo "$STAMP_CONTENT" > "$STAMP"
echo "peer venv ready: $VENV"
