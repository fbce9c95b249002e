"""Model families. Importing this package registers every family with the transformers Auto classes."""

from . import inductive_bert, recurrent_decoder, transformer_xl
from .inductive_bert import *  # noqa: F403
from .recurrent_decoder import *  # noqa: F403
from .transformer_xl import *  # noqa: F403


__all__ = [*inductive_bert.__all__, *recurrent_decoder.__all__, *transformer_xl.__all__]
