"""mmtrt: an ahead-of-time compiler for LLaVA-style multimodal models."""

__version__ = "0.1.0"
