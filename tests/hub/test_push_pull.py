"""Push every family to the test Hub, then pull it where `hf_recurrence` cannot be imported (issue 6)."""

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi, hf_hub_download
from transformers import PreTrainedModel, PreTrainedTokenizerBase, pipeline

from hf_recurrence.hub import push_to_hub

from ..common import run_isolated_python
from ..families import HUB_ROWS, Backbone, Family


@dataclass
class PushedRepo:
    family: Family | Backbone
    repo_id: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase


@pytest.fixture(scope="module", params=HUB_ROWS, ids=lambda family: family.model_type)
def pushed(request) -> PushedRepo:
    """A tiny model with its tokenizer on `main`, and on the branch "invalid" a config.json with a bad setting."""
    family: Family | Backbone = request.param
    model, tokenizer = family.hub.make()
    repo_id = f"alice/pull-{family.model_type}"
    push_to_hub(model, repo_id, tokenizer=tokenizer)
    config = json.loads(Path(hf_hub_download(repo_id, "config.json")).read_text())
    name, value = family.hub.invalid_setting
    api = HfApi()
    api.create_branch(repo_id, branch="invalid")
    api.upload_file(
        path_or_fileobj=json.dumps({**config, name: value}).encode(),
        path_in_repo="config.json",
        repo_id=repo_id,
        revision="invalid",
        commit_message=f"Set {name}={value!r}",
    )
    return PushedRepo(family, repo_id, model, tokenizer)


def as_json(output) -> object:
    """A pipeline output as plain JSON, floats rounded so that two processes' results compare equal."""
    return json.loads(
        json.dumps(output, default=lambda tensor: tensor.tolist()), parse_float=lambda f: round(float(f), 4)
    )


PULL = """
import json
import torch
import transformers
try:
    import hf_recurrence
    raise SystemExit("hf_recurrence must not be importable here")
except ImportError:
    pass
repo_id, reference = {repo_id!r}, torch.load({reference!r})
auto_class = getattr(transformers, {auto_class!r})
model = auto_class.from_pretrained(repo_id, trust_remote_code=True).eval()
assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
# The pulled weights are bit-identical; another kernel path may move fp32 logits by ~1e-7 (see ACROSS_KERNELS).
torch.testing.assert_close(model(reference["input_ids"]).logits, reference["logits"], rtol=1e-6, atol=1e-6)
pipe = transformers.pipeline({task!r}, model=repo_id, trust_remote_code=True)
assert type(pipe.model).__module__.startswith("transformers_modules."), type(pipe.model).__module__
output = pipe({inputs!r}, **{kwargs!r})
try:
    auto_class.from_pretrained(repo_id, revision="invalid", trust_remote_code=True)
    invalid = None
except Exception as error:
    invalid = {{"types": [cls.__name__ for cls in type(error).__mro__], "message": str(error)}}
print("RESULT " + json.dumps({{"pipeline": output, "invalid": invalid}}, default=lambda tensor: tensor.tolist()))
"""


@pytest.mark.remote_code
def test_pull_in_a_fresh_interpreter_without_the_package(pushed, hub_server, tmp_path):
    family = pushed.family.hub
    input_ids = torch.randint(1, pushed.model.config.get_text_config().vocab_size, (2, family.reference_length))
    with torch.no_grad():
        torch.save({"input_ids": input_ids, "logits": pushed.model(input_ids).logits}, tmp_path / "reference.pt")
    code = PULL.format(
        repo_id=pushed.repo_id,
        reference=str(tmp_path / "reference.pt"),
        auto_class=family.auto_class,
        task=family.pipeline_task,
        inputs=family.pipeline_inputs,
        kwargs=family.pipeline_kwargs,
    )
    (tmp_path / "elsewhere").mkdir()
    result = run_isolated_python(
        code,
        cwd=tmp_path / "elsewhere",
        hf_home=tmp_path / "hf_home",
        env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": hub_server.url},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    pulled = json.loads(result.stdout.split("RESULT ", 1)[1])

    local = pipeline(family.pipeline_task, model=pushed.model, tokenizer=pushed.tokenizer)
    expected = as_json(local(family.pipeline_inputs, **family.pipeline_kwargs))
    assert as_json(pulled["pipeline"]) == expected
    if family.context_limit is not None:
        generated = expected[0]["generated_token_ids"]
        assert len(generated) > family.context_limit(pushed.model.config)

    name, value = family.invalid_setting
    assert pulled["invalid"] is not None, f"{name}={value!r} in config.json loaded without an error"
    assert "ValueError" in pulled["invalid"]["types"], pulled["invalid"]
    assert name in pulled["invalid"]["message"]
