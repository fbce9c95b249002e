"""The `hf-recurrence` command line."""

import argparse
import sys
from collections.abc import Sequence

from huggingface_hub import constants
from huggingface_hub.errors import HTTPError
from transformers import HfArgumentParser

from .commands import convert, evaluate, generate, pretrain, push, reproduce
from .outputs import UsageError


# command -> (module with `add_arguments(parser)`, `run(args) -> int` and maybe `OPTION_CLASSES`, one-line help)
COMMANDS = {
    "convert": (convert, "Convert a stock causal LM (folder or GGUF) into a recurrent one."),
    "evaluate": (evaluate, "Windowed perplexity and FLOPs/token of models over overlaps."),
    "generate": (generate, "Generate text with a (recurrent) causal LM."),
    "push": (push, "Upload a saved model folder to the Hub with a model card."),
    "reproduce": (reproduce, "Reproduce the recurrence paper's comparison (the main job)."),
    "pretrain": (pretrain, "Pretrain the small GPT-2 that serves as the embedded default."),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-recurrence",
        description="Recurrence across windows of text for Hugging Face transformers models.",
    )
    # Each command is an HfArgumentParser: the options of a settings dataclass come from its fields' metadata.
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=HfArgumentParser)
    for name, (module, help_text) in COMMANDS.items():
        module.add_arguments(
            commands.add_parser(
                name,
                dataclass_types=getattr(module, "OPTION_CLASSES", ()),
                help=help_text,
                description=module.__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
        )
    return parser


# What a user can cause and fix: a bad option value (`UsageError`, or a `ValueError` from a config's validation), a
# model or file that is missing or unreadable, no Hub access or a Hub refusal (`OSError`s: `FileNotFoundError`,
# huggingface_hub's `OfflineModeIsEnabled`, `HfHubHTTPError`), a Hub that cannot be reached (huggingface_hub's
# `HTTPError`, the HTTP client's base error, whose connection errors are not `OSError`s). Anything else is a bug and
# keeps its traceback.
USER_ERRORS = (UsageError, ValueError, OSError, HTTPError)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module = COMMANDS[args.command][0]
    try:
        return module.run(args)
    except USER_ERRORS as error:
        # One line, the argparse convention (`prog: error: message`, exit status 2).
        message = " ".join(line.strip() for line in str(error).splitlines() if line.strip()) or type(error).__name__
        if isinstance(error, HTTPError) and not isinstance(error, OSError):
            message = f"cannot reach the Hub at {constants.ENDPOINT}: {message}"
        print(f"hf-recurrence {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
