"""Subcommands of the `hf-recurrence` command line: each module has `add_arguments(parser)` and `run(args)`."""
