"""treellm's OpenTelemetry instrumentation: the observer, content capture and the names it uses.

Public: ``TelemetryObserver``, ``Capture``, ``semconv`` (every span, event,
attribute and metric name, pinned to a GenAI semantic conventions version).
"""

import importlib as _importlib
import typing as _typing

from treellm.telemetry import semconv
from treellm.telemetry.redaction import Capture, CaptureMode, redact_text, redact_value

if _typing.TYPE_CHECKING:
    from treellm.telemetry.observer import TelemetryObserver

__all__ = ["Capture", "CaptureMode", "TelemetryObserver", "redact_text", "redact_value", "semconv"]


def __getattr__(name: str) -> _typing.Any:
    """``TelemetryObserver`` on first use (PEP 562): it imports the engine, which ingest, the
    conventions and the redaction, all of this package, do not need."""
    if name == "TelemetryObserver":
        value = _importlib.import_module("treellm.telemetry.observer").TelemetryObserver
        globals()[name] = value
        return value
    raise AttributeError(f"module 'treellm.telemetry' has no attribute {name!r}")
