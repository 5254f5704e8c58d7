"""Runnable examples: ``python -m exogym.examples.<name>``."""
