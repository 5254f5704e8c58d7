"""Built-in tasks whose data ships with an installed package (no download)."""

from exogym.tasks.digits import MLPClassifier, digits_datasets

__all__ = ["MLPClassifier", "digits_datasets"]
