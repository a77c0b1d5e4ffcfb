"""mmtrt: an ahead-of-time compiler for LLaVA-style multimodal models."""

import os

__version__ = "0.1.0"

# ONNX Runtime's usage telemetry (on Linux since 1.31) stores a device id under the home folder when it is first
# imported, and warns on stderr where that folder is not writable (a service account, a read-only container): a
# second line beside a one-line error. mmtrt sends none; a user who wants it sets ORT_DISABLE_TELEMETRY=0.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
