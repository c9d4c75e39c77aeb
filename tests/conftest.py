"""Shared test setup: the Hub is unreachable here, so every test runs offline."""

import os


# Set before any test module imports huggingface_hub, which reads it once at import time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
