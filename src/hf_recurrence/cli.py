"""The `hf-recurrence` command line."""

import argparse
import importlib
import sys
from collections.abc import Sequence

from huggingface_hub import constants
from huggingface_hub.errors import HTTPError

from .outputs import UsageError


# command -> (module implementing `add_arguments(parser)` and `run(args) -> int`, one-line help)
COMMANDS = {
    "convert": (
        "hf_recurrence.commands.convert",
        "Convert a GPT-2 or Llama checkpoint (folder or GGUF) into a recurrent one.",
    ),
    "evaluate": ("hf_recurrence.commands.evaluate", "Windowed perplexity and FLOPs/token of models over overlaps."),
    "generate": ("hf_recurrence.commands.generate", "Generate text with a (recurrent) causal LM."),
    "push": ("hf_recurrence.commands.push", "Upload a saved model folder to the Hub with a model card."),
    "reproduce": ("hf_recurrence.commands.reproduce", "Reproduce the recurrence paper's comparison (the main job)."),
    "pretrain": ("hf_recurrence.commands.pretrain", "Pretrain the small GPT-2 that serves as the embedded default."),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-recurrence",
        description="Recurrence across windows of text for Hugging Face transformers models.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        module = importlib.import_module(module_name)
        module.add_arguments(
            commands.add_parser(
                name,
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
    module = importlib.import_module(COMMANDS[args.command][0])
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
