"""The ``trtfleet`` command line: one entry point, one subcommand per component.

Each subcommand lives in its component's package and exposes
``configure(parser: argparse.ArgumentParser) -> None``, which adds its arguments
and sets ``parser.set_defaults(func=...)``; ``func(args) -> int`` is the exit code.
Only the chosen component is imported, so ``trtfleet router`` never loads kopf and
``trtfleet crds`` never loads grpc.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NamedTuple

from trtfleet.version import __version__

EXIT_NOT_AVAILABLE = 2


class Command(NamedTuple):
    module: str
    help: str


COMMANDS: dict[str, Command] = {
    "operator": Command("trtfleet_operator.cli", "run the Kubernetes operator (kopf)"),
    "router": Command("trtfleet_router.cli", "run the adapter-aware OpenAI/Triton router"),
    "worker": Command("trtfleet_engines.reference.cli", "run a CPU reference-engine Triton worker"),
    "demo": Command("trtfleet.demo", "run the local demo: reference workers + router, no GPU, no cluster"),
    "engines": Command("trtfleet_engines.cli", "plan, render, size and build TensorRT-LLM engines"),
    "lora": Command("trtfleet_engines.lora.cli", "convert and inspect PEFT LoRA adapters"),
    "crds": Command("trtfleet.api.cli", "print or write the CustomResourceDefinitions"),
}


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trtfleet",
        description="Kubernetes operator and adapter-aware router for Triton + TensorRT-LLM multi-LoRA fleets.",
    )
    parser.add_argument("--version", action="version", version=f"trtfleet {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in COMMANDS.items():
        sub.add_parser(name, help=command.help, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        parsed = _top_parser().parse_args(args)
        if parsed.command is None:
            _top_parser().print_help()
        return EXIT_NOT_AVAILABLE if parsed.command is None else 0
    name, rest = args[0], args[1:]
    command = COMMANDS[name]
    try:
        module = importlib.import_module(command.module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and command.module.startswith(exc.name):
            print(f"trtfleet {name}: not available yet in this build", file=sys.stderr)
            return EXIT_NOT_AVAILABLE
        raise
    parser = argparse.ArgumentParser(prog=f"trtfleet {name}", description=command.help)
    module.configure(parser)
    parsed = parser.parse_args(rest)
    func = getattr(parsed, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_NOT_AVAILABLE
    return int(func(parsed))


if __name__ == "__main__":
    raise SystemExit(main())
