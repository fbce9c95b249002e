"""`evaluate` module computing `hf_recurrence.evaluation.windowed_perplexity`; load it with
`evaluate.load(hf_recurrence.evaluation.METRIC_PATH)`.

`evaluate` copies this file into its modules cache and imports it from there, so it imports the package absolutely.
"""

import datasets
import evaluate
from transformers import AutoModelForCausalLM, PreTrainedModel

from hf_recurrence.evaluation import windowed_perplexity


_DESCRIPTION = """Perplexity of a causal language model over long documents read in windows of `window_size` tokens
that repeat the last `overlap` tokens of the previous window (Yoshida, Ettinger and Gimpel 2020, §4.2). Every token
but a document's first is predicted exactly once. Recurrent models of hf_recurrence carry their state through each
document and must be evaluated with the overlap they were trained with; a Transformer-XL carries its memory through
each document, in its own segments."""

_KWARGS_DESCRIPTION = """
Args:
    input_ids (`list[list[int]]`): token ids, one document per row; documents are evaluated independently.
    model (`PreTrainedModel` or `str`): the causal language model, or a local directory to load it from.
    window_size (`int`, *optional*), overlap (`int`, *optional*): the window schedule; see `windowed_perplexity`.
    num_words (`int`, *optional*): word count of the documents, for `word_perplexity`.
    batch_size (`int`, *optional*, defaults to 8): windows per forward for a stock model.
Returns:
    The fields of `WindowedPerplexity`: perplexity, nll, num_tokens, num_documents, window_size, overlap,
    flops_per_token, num_words, word_perplexity.
Examples:
    >>> import evaluate
    >>> from hf_recurrence.evaluation import METRIC_PATH
    >>> metric = evaluate.load(METRIC_PATH)  # doctest: +SKIP
    >>> metric.compute(input_ids=[[1, 2, 3]], model=model, window_size=2, overlap=1)  # doctest: +SKIP
"""

_CITATION = """@inproceedings{yoshida-etal-2020-adding,
    title = "Adding Recurrence to Pretrained Transformers for Improved Efficiency and Context Size",
    author = "Yoshida, Davis and Ettinger, Allyson and Gimpel, Kevin",
    year = "2020",
}"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class WindowedPerplexityMetric(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            module_type="metric",
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int64"))}),
        )

    def _compute(
        self,
        input_ids: list[list[int]],
        model: PreTrainedModel | str,
        window_size: int | None = None,
        overlap: int | None = None,
        num_words: int | None = None,
        batch_size: int = 8,
    ) -> dict:
        if isinstance(model, str):
            model = AutoModelForCausalLM.from_pretrained(model)
        result = windowed_perplexity(
            model, input_ids, window_size, overlap, num_words=num_words, batch_size=batch_size, show_progress=False
        )
        return result.to_dict()
