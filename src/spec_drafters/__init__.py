"""spec-drafters: train and evaluate block-diffusion (DFlash) speculative-decoding drafters."""

__version__ = "0.1.0"
