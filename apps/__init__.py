"""The Gradio demo. This file stays free of heavy imports, so that `python -m apps.demo` can restart
with another allocator before gradio and Keras load (commands/malloc.py)."""

from pathlib import Path

DEFAULT_CHECKPOINT = Path(__file__).resolve().parent.parent / "checkpoints" / "fashion-mnist-vit" / "model.keras"
