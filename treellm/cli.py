"""The ``treellm`` command: parse, call one library function, render.

A :class:`~treellm.errors.TreeLLMError` becomes one line on stderr and exit
status 1, never a traceback. Every command's help carries an example.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from treellm._version import __version__
from treellm.errors import TreeLLMError
from treellm.signature import RawArguments, canonical_json, parse_arguments, signature


def _cmd_sign(args: argparse.Namespace) -> int:
    value = parse_arguments(args.arguments)
    out = {
        "tool": args.tool,
        "signature": signature(args.tool, value),
        "canonical": canonical_json(value),
        "valid_json": not isinstance(value, RawArguments),
    }
    print(json.dumps(out, ensure_ascii=False))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="treellm",
        description="Path-local loop detection, tracing and analysis for tree-shaped LLM agents.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"treellm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    sign = sub.add_parser(
        "sign",
        help="print the tree-llm signature and canonical JSON of a tool call",
        description="Print the tree-llm compatible signature of one tool call.",
        epilog='example:\n  treellm sign search \'{"query": "loop detection", "limit": 10}\'',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sign.add_argument("tool", help="tool name")
    sign.add_argument("arguments", help="the call's arguments as the model sent them (JSON text)")
    sign.set_defaults(func=_cmd_sign)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args))
    except TreeLLMError as exc:
        print(f"treellm: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("treellm: interrupted", file=sys.stderr)
        return 130
