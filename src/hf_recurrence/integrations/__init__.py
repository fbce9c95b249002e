"""Glue to third-party libraries our users run beside transformers; each module is optional and checks for its
library."""
