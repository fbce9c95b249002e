"""Subcommands of the `hf-recurrence` command line, one module each with `add_arguments(parser)` and `run(args)`."""
