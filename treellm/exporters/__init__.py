"""Span exporters: thin I/O shells over the pure conversions in :mod:`treellm.otlp`."""
