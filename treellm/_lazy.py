"""A package's public names imported on first use (PEP 562), for ``treellm`` and ``treellm.telemetry``.

Stdlib only: a package's ``__init__`` imports it before anything else of treellm.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    namespace: dict[str, Any], table: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the package whose globals are ``namespace``: each
    name of ``table`` (name -> the module that defines it) is imported when first read and kept
    in ``namespace``, so the next read is a plain attribute; ``dir`` lists the names of
    ``__all__`` before they are read. Any other name raises :class:`AttributeError`."""
    package = namespace["__name__"]

    def getattr_(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *namespace.get("__all__", ())})

    return getattr_, dir_
