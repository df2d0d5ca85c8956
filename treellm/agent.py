"""The public ``TreeExecutor``: the engine with the telemetry observer attached.

``telemetry=True`` (the default) attaches the OpenTelemetry observer on the
global tracer provider, or on ``tracer_provider`` when one is given;
``telemetry=False`` runs the bare engine.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence

from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from treellm.config import TreeConfig
from treellm.engine.events import Observer
from treellm.engine.executor import Engine
from treellm.engine.run import Clock, Sleep
from treellm.engine.tools import Skill, Tool
from treellm.models.base import ChatModel
from treellm.telemetry.observer import TelemetryObserver

__all__ = ["TreeExecutor"]


class TreeExecutor(Engine):
    """Run an agent as a tree with path-local loop detection (see the README).

    ``run(task)`` (sync), ``await arun(task)`` and ``stream(task)`` (an async
    iterator of chunks). One executor may run many tasks at once.
    """

    def __init__(
        self,
        model: ChatModel,
        tools: Sequence[Tool] = (),
        config: TreeConfig | None = None,
        *,
        name: str = "agent",
        skills: Sequence[Skill] = (),
        observers: Sequence[Observer] = (),
        telemetry: bool = True,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        clock: Clock = time.time_ns,
        sleep: Sleep = asyncio.sleep,
        run_ids: Callable[[], str] = lambda: uuid.uuid4().hex,
    ) -> None:
        super().__init__(
            model,
            tools,
            config,
            name=name,
            skills=skills,
            observers=observers,
            clock=clock,
            sleep=sleep,
            run_ids=run_ids,
        )
        self.telemetry: TelemetryObserver | None = None
        if telemetry:
            self.telemetry = TelemetryObserver(tracer_provider, meter_provider)
            self.observers.insert(0, self.telemetry)
