"""Reads a drafter folder with vLLM's own config code and prints what vLLM makes of it, as one JSON line.

Run by the Python of vLLM's environment (it imports nothing of spec_drafters, which is not installed
there): ``.vllm-venv/bin/python src/spec_drafters/cli/vllm_probe.py FOLDER``. Used by the export test
(tests/test_engine_export.py) and by ``serve-eval`` before it starts a server, so a folder vLLM would
misread fails in seconds, not after a model load.

The two steps are vLLM's own: ``maybe_override_with_speculators`` (how ``vllm serve FOLDER`` and a
``--speculative-config`` naming FOLDER recognise the speculators format and find the verifier) and
``get_config`` (the drafter's config as the DFlash model class receives it).
"""

from __future__ import annotations

import json
import sys


def probe(folder: str) -> dict:
    from vllm.transformers_utils.config import get_config, maybe_override_with_speculators

    model, _tokenizer, speculative = maybe_override_with_speculators(folder, None, trust_remote_code=False)
    config = get_config(folder, trust_remote_code=False)
    dflash = getattr(config, "dflash_config", None) or {}
    return {
        "verifier": model,
        "speculative_config": speculative,
        "config_class": type(config).__name__,
        "architectures": list(getattr(config, "architectures", None) or []),
        "draft_vocab_size": getattr(config, "draft_vocab_size", None),
        "vocab_size": getattr(config, "vocab_size", None),
        "hidden_size": getattr(config, "hidden_size", None),
        "num_hidden_layers": getattr(config, "num_hidden_layers", None),
        "eagle_aux_hidden_state_layer_ids": getattr(config, "eagle_aux_hidden_state_layer_ids", None),
        "dflash_config": dict(dflash),
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python vllm_probe.py DRAFTER_FOLDER")
    print(json.dumps(probe(sys.argv[1])))
