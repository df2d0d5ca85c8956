"""treellm's OpenTelemetry instrumentation: the observer, content capture and the names it uses.

Public: ``TelemetryObserver``, ``Capture``, ``semconv`` (every span, event,
attribute and metric name, pinned to a GenAI semantic conventions version).
"""

from treellm.telemetry import semconv
from treellm.telemetry.observer import TelemetryObserver
from treellm.telemetry.redaction import Capture, CaptureMode, redact_text, redact_value

__all__ = ["Capture", "CaptureMode", "TelemetryObserver", "redact_text", "redact_value", "semconv"]
