"""The package version (read by hatchling and ``treellm --version``)."""

__version__ = "0.1.0"
