"""Command-line options shared by the commands, and options from settings dataclasses, parsed by transformers'
`HfArgumentParser` as `examples/` are.

A settings dataclass documents each field once, in `field(metadata={"help": ...})`; the command line, the presets and
the docstrings all read it from there.
"""

import argparse
import dataclasses
import typing
from collections.abc import Sequence


def add_overwrite_argument(parser: argparse.ArgumentParser) -> None:
    """`--overwrite`, as every command writing to `--output_dir` has it (see `outputs.prepare_output_dir`)."""
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="Replace what an earlier run of this command wrote in output_dir (a folder holding anything else is refused).",
    )


def preset_options(
    settings_class: type, *, skip: Sequence[str] = (), label: str = "default", prefix: str = ""
) -> type:
    """`settings_class`'s fields as a dataclass of command-line options for `HfArgumentParser`, each defaulting to
    None, so that an option given on the command line can be told apart from one left to a preset. A `Sequence[X]`
    field takes one or more values; each help text starts with `prefix` and ends with the settings class's own
    default (`label: value`)."""
    defaults = settings_class()
    hints = typing.get_type_hints(settings_class)
    options = []
    for f in dataclasses.fields(settings_class):
        if f.name in skip or not f.init:
            continue
        kind = hints[f.name]
        if typing.get_origin(kind) is Sequence:
            # HfArgumentParser reads one or more values into a list
            kind = list[typing.get_args(kind)[0]]  # type: ignore[misc]  # a type built at run time, not an annotation
        if type(None) not in typing.get_args(kind):
            kind = kind | None
        default = getattr(defaults, f.name)
        shown = list(default) if isinstance(default, tuple) else default
        help_text = f"{prefix}{f.metadata['help']} {label}: {shown}."
        options.append((f.name, kind, dataclasses.field(default=None, metadata={"help": help_text})))
    return dataclasses.make_dataclass(f"{settings_class.__name__}Options", options)


def given_options(args, option_classes: Sequence[type]) -> dict:
    """The options of `option_classes` given on the command line (the others are None), by field name."""
    names = [f.name for option_class in option_classes for f in dataclasses.fields(option_class)]
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}
