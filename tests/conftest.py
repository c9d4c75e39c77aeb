"""Shared test setup: the Hub is unreachable here, so every test runs offline."""

import os


# Set before any test module imports transformers / huggingface_hub, which read these once at import time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
