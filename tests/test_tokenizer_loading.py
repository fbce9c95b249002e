"""A recurrent checkpoint's tokenizer loads with `trust_remote_code=False` in an interpreter that has never imported
hf_recurrence: no question about the model's code, and the same token ids (docs/guides/sharing.md)."""

from pathlib import Path

from transformers import AutoTokenizer

import hf_recurrence
from hf_recurrence import RecurrentGPT2LMHeadModel

from .common import run_isolated_python


DEFAULT_MODEL = Path(hf_recurrence.__file__).parent / "default_model"
QUESTION = "Do you wish to run the custom code?"
LOAD = """
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained({folder!r}{argument})
print("IDS", tokenizer("It was a bright cold day in April.")["input_ids"])
"""


def test_the_tokenizer_of_a_recurrent_checkpoint_loads_without_the_remote_code_question(tmp_path):
    folder = tmp_path / "checkpoint"
    RecurrentGPT2LMHeadModel.from_pretrained(DEFAULT_MODEL).save_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL)
    tokenizer.save_pretrained(folder)
    expected = f"IDS {tokenizer('It was a bright cold day in April.')['input_ids']}"

    answered = run_isolated_python(
        LOAD.format(folder=str(folder), argument=", trust_remote_code=False"), cwd=tmp_path, hf_home=tmp_path / "hf"
    )
    assert answered.returncode == 0, answered.stderr[-2000:]
    assert QUESTION not in answered.stdout + answered.stderr
    assert expected in answered.stdout

    # Without the argument transformers asks (here stdin is closed, so it gives up at once instead of after 15 s).
    asked = run_isolated_python(LOAD.format(folder=str(folder), argument=""), cwd=tmp_path, hf_home=tmp_path / "hf")
    assert QUESTION in asked.stdout + asked.stderr
    assert expected in asked.stdout
