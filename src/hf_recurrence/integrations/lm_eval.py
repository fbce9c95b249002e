"""lm-evaluation-harness with the recurrent families: a registered `hf-recurrence` model whose context is unbounded.

lm-eval's `hf` model takes its context length from `config.n_positions` (or `max_position_embeddings`): for a
recurrent model that is the size of one window, so `loglikelihood_rolling` (perplexity tasks) scores a long document
as independent window-sized chunks and `generate_until` / `loglikelihood` cut the left context to one window; the
recurrence is never used. That attribute sizes the position table, so it cannot be changed on the config. Instead,
importing this module registers `hf-recurrence`: lm-eval's `hf` model with a context length of
`UNBOUNDED_CONTEXT` tokens unless `max_length` is given, so every document reaches the model whole and the model's
own windows carry the context. Python:

    import hf_recurrence.integrations.lm_eval  # registers "hf-recurrence"
    lm_eval.simple_evaluate(model="hf-recurrence", model_args="pretrained=FOLDER", tasks=[...])

Command line (lm-eval finds models only among those imported, so this module imports itself, then runs lm-eval's
own command line with the arguments given):

    python -m hf_recurrence.integrations.lm_eval run --model hf-recurrence --model_args pretrained=FOLDER --tasks ...

What cannot work (another model type, `batch_size=auto`) is refused with a `UsageError` (a `ValueError`), before any
weight loads; the command line prints it in one line, `hf-recurrence lm-eval: error: ...`, and exits with status 2.

Memory: lm-eval asks for the logits of every position of a document at once, `(length, vocab)` floats.
"""

import sys

from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from ..models.recurrent_decoder import RecurrentGPT2Config, RecurrentLlamaConfig
from ..models.transformer_xl import TransformerXLConfig
from ..outputs import UsageError


# lm-eval splits inputs longer than max_length into independent pieces; no document of a benchmark comes near this.
UNBOUNDED_CONTEXT = 2**30
CAUSAL_MODEL_TYPES = tuple(
    config.model_type for config in (RecurrentGPT2Config, RecurrentLlamaConfig, TransformerXLConfig)
)


@register_model("hf-recurrence")
class RecurrentHFLM(HFLM):
    """lm-eval's `hf` model for the recurrent causal families, whose context is unbounded: every model argument of
    `hf` is accepted (a model id or folder, or a loaded model with its tokenizer); `max_length` defaults to
    `UNBOUNDED_CONTEXT` instead of one window."""

    def __init__(self, pretrained, max_length: int | None = None, batch_size: int | str = 1, **kwargs) -> None:
        if str(batch_size).startswith("auto"):
            # lm-eval's batch size search runs a batch of max_length tokens: here, a billion.
            raise UsageError(
                f"batch_size={batch_size!r} cannot be used with hf-recurrence: lm-eval finds it by running batches "
                "of max_length tokens, and the recurrent models' max_length is unbounded; give a number"
            )
        super().__init__(
            pretrained=pretrained, max_length=max_length or UNBOUNDED_CONTEXT, batch_size=batch_size, **kwargs
        )

    def _get_backend(self, config, backend: str = "default", trust_remote_code: bool | None = False) -> None:
        # HFLM calls this with the model's config before it loads the tokenizer or the weights.
        if config.model_type not in CAUSAL_MODEL_TYPES:
            raise UsageError(
                f"{config.name_or_path or 'This model'} is a {config.model_type!r} model; hf-recurrence evaluates the "
                f"recurrent causal families ({', '.join(CAUSAL_MODEL_TYPES)}). Use lm-eval's own `hf` model for others"
            )
        super()._get_backend(config=config, backend="causal", trust_remote_code=trust_remote_code)


def main() -> None:
    """lm-eval's command line, with `hf-recurrence` registered."""
    from lm_eval.__main__ import cli_evaluate

    sys.argv[0] = "lm_eval"
    try:
        cli_evaluate()
    except UsageError as error:
        # Our refusals say what to change; lm-eval's ~30 lines of traceback around them would bury that. Anything
        # else (lm-eval's own errors, bugs) keeps its traceback.
        print(f"hf-recurrence lm-eval: error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
