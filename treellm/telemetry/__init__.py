"""treellm's OpenTelemetry instrumentation: the observer, content capture and the names it uses.

Public: ``TelemetryObserver``, ``Capture``, ``semconv`` (every span, event,
attribute and metric name, pinned to a GenAI semantic conventions version).
"""

import typing as _typing

from treellm._lazy import lazy_names as _lazy_names
from treellm.telemetry import semconv
from treellm.telemetry.redaction import Capture, CaptureMode, redact_text, redact_value

if _typing.TYPE_CHECKING:
    from treellm.telemetry.observer import TelemetryObserver

__all__ = ["Capture", "CaptureMode", "TelemetryObserver", "redact_text", "redact_value", "semconv"]

_LAZY = {"TelemetryObserver": "treellm.telemetry.observer"}
"""Imported on first use: the observer imports the engine, which ingest, the conventions and the
redaction (all of this package) do not need."""

__getattr__, __dir__ = _lazy_names(globals(), _LAZY)
