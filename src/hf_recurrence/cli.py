"""The `hf-recurrence` command line."""

import argparse
from collections.abc import Sequence

from . import demo
from .commands import push


# name -> (module with `add_arguments(parser)`, `run(args) -> int` and a docstring, one-line help, help formatter)
COMMANDS = {
    "demo": (
        demo,
        "Offline demo: convert a small GPT-2 into a recurrent one, train it on real text, generate.",
        argparse.ArgumentDefaultsHelpFormatter,
    ),
    "push": (push, "Upload a saved model folder to the Hub with a model card.", argparse.RawDescriptionHelpFormatter),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-recurrence",
        description="Recurrence across windows of text for Hugging Face transformers models.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, summary, formatter_class) in COMMANDS.items():
        module.add_arguments(
            commands.add_parser(name, help=summary, description=module.__doc__, formatter_class=formatter_class)
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        # The demo returns its metrics to Python callers; on the command line it succeeded if it returned.
        demo.run(args)
        return 0
    return COMMANDS[args.command][0].run(args)


if __name__ == "__main__":
    raise SystemExit(main())
