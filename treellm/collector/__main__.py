"""``python -m treellm.collector``: the collector from the command line (the options of ``treellm collect``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from treellm.collector.command import DESCRIPTION, EPILOG, add_arguments, run
from treellm.errors import TreeLLMError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m treellm.collector",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except TreeLLMError as exc:
        print(f"treellm collect: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
