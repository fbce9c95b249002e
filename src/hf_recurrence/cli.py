"""The `hf-recurrence` command line."""

import argparse
from collections.abc import Sequence

from . import demo


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-recurrence",
        description="Recurrence across windows of text for Hugging Face transformers models.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo.add_arguments(
        commands.add_parser(
            "demo",
            help="Offline demo: convert a small GPT-2 into a recurrent one, train it on real text, generate.",
            description=demo.__doc__,
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        demo.run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
