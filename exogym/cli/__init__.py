"""Command-line pieces: ``exogym compare`` and its plots (``python -m exogym`` is the entry)."""
