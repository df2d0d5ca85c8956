"""Filters shared by every analysis function, as one SQL condition with parameters.

Time, service, agent and model are properties of a run (the ``runs`` view), so they
select runs; ``tool`` selects calls. Every analysis relation has a ``run_id`` column.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from treellm import settings

__all__ = ["Filters", "check_limit", "moment"]


@dataclass(frozen=True, slots=True)
class Filters:
    """Time window (``since`` <= run start < ``until``), service, agent, model and tool."""

    since: dt.datetime | None = None
    until: dt.datetime | None = None
    service: str | None = None
    agent: str | None = None
    model: str | None = None
    tool: str | None = None

    def run_condition(self, alias: str = "r") -> tuple[str, list[Any]]:
        """A condition on the ``runs`` view (aliased ``alias``)."""
        clauses: list[str] = []
        params: list[Any] = []
        for column, value in (
            ("start_ns >=", _ns(self.since) if self.since else None),
            ("start_ns <", _ns(self.until) if self.until else None),
            ("service =", self.service),
            ("agent =", self.agent),
            ("model =", self.model),
        ):
            if value is not None:
                clauses.append(f"{alias}.{column} ?")
                params.append(value)
        return (" AND ".join(clauses) or "TRUE"), params

    def where(self, alias: str, *, tool_column: str | None = "tool") -> tuple[str, list[Any]]:
        """A condition on a relation with ``run_id`` (and a tool column, when given)."""
        run_sql, params = self.run_condition("r")
        clauses = []
        if run_sql != "TRUE":
            clauses.append(f"{alias}.run_id IN (SELECT r.run_id FROM runs r WHERE {run_sql})")
        if tool_column is not None and self.tool is not None:
            clauses.append(f"{alias}.{tool_column} = ?")
            params.append(self.tool)
        return (" AND ".join(clauses) or "TRUE"), params


def moment(text: str, now: dt.datetime) -> dt.datetime:
    """A bound of a time window as people write it: an ISO date or time (naive ones are UTC), or an
    age such as ``7d``, ``12h`` or ``2w`` (:func:`treellm.settings.age`): that long before ``now``.
    Raises ValueError naming both forms."""
    if (ago := settings.age(text)) is not None:
        return now - ago
    try:
        return dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"expected an ISO date or time such as 2026-11-30 or 2026-11-30T12:00, or an age such as 7d or 12h "
            f"(that long ago), got {text!r}"
        ) from None


def _ns(moment: dt.datetime) -> int:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1e9)


def check_limit(limit: int | None) -> None:
    """Refuse a row limit below 0 (None: no limit) with a ValueError quoting it."""
    if limit is not None and limit < 0:
        raise ValueError(f"expected a limit >= 0, got {limit}")
