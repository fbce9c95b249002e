"""Sharing on the Hugging Face Hub: model cards and pushes that load anywhere with `trust_remote_code=True`.

The model folders stay self-contained (they cannot import `hf_recurrence`), so what a card says about a family's
paper and pipeline lives here, in `FAMILIES`, keyed by `model_type`; the config fields it lists as the family's
settings come from the config class (`family_settings`). Adding a family to the cards is one entry here.
"""

import os
import tempfile
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

from huggingface_hub import CommitInfo, CommitOperationAdd, EvalResult, HfApi, ModelCard, ModelCardData
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from transformers import AutoConfig, PreTrainedConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.utils import logging

from .outputs import MODEL_FOLDER_FILES, UsageError


logger = logging.get_logger(__name__)

# The top-level files of a folder that `push_folder` uploads: the model folder's files (`MODEL_FOLDER_FILES`) but
# no pickle, which runs code when loaded and may hold secrets.
MODEL_REPO_FILES = tuple(
    pattern
    for pattern in MODEL_FOLDER_FILES
    if not pattern.endswith(".bin") and not pattern.endswith(".bin.index.json")
)

DEFAULT_COMMIT_MESSAGE = "Upload model with hf-recurrence"


@dataclass(frozen=True)
class Paper:
    """A paper a family implements, cited on its model cards."""

    authors: tuple[str, ...]
    title: str
    year: int
    arxiv: str

    @property
    def url(self) -> str:
        return f"https://arxiv.org/abs/{self.arxiv}"

    @property
    def short_authors(self) -> str:
        surnames = [author.split()[-1] for author in self.authors]
        if len(surnames) > 3:
            return f"{surnames[0]} et al."
        return " and ".join([", ".join(surnames[:-1]), surnames[-1]]) if len(surnames) > 1 else surnames[0]

    def bibtex(self) -> str:
        key = f"{self.authors[0].split()[-1].lower()}{self.year}"
        return (
            f"@article{{{key},\n"
            f"  title = {{{self.title}}},\n"
            f"  author = {{{' and '.join(self.authors)}}},\n"
            f"  journal = {{arXiv preprint arXiv:{self.arxiv}}},\n"
            f"  year = {{{self.year}}}\n"
            "}"
        )


@dataclass(frozen=True)
class FamilyCard:
    """What a model card says about one model family."""

    name: str
    paper: Paper
    pipeline_tag: str
    auto_class: str


# The paper the recurrent GPT-2, the recurrent Llama and the recurrent decoder implement.
RECURRENCE_PAPER = Paper(
    authors=("Davis Yoshida", "Allyson Ettinger", "Kevin Gimpel"),
    title="Adding Recurrence to Pretrained Transformers for Improved Efficiency and Context Size",
    year=2020,
    arxiv="2008.07027",
)

FAMILIES: dict[str, FamilyCard] = {
    "recurrent_gpt2": FamilyCard(
        name="Recurrent GPT-2",
        paper=RECURRENCE_PAPER,
        pipeline_tag="text-generation",
        auto_class="AutoModelForCausalLM",
    ),
    "recurrent_llama": FamilyCard(
        name="Recurrent Llama",
        paper=RECURRENCE_PAPER,
        pipeline_tag="text-generation",
        auto_class="AutoModelForCausalLM",
    ),
    "recurrent_decoder": FamilyCard(
        name="Recurrent decoder",
        paper=RECURRENCE_PAPER,
        pipeline_tag="text-generation",
        auto_class="AutoModelForCausalLM",
    ),
    "inductive_bert": FamilyCard(
        name="I-BERT (inductive BERT)",
        paper=Paper(
            authors=("Hyoungwook Nam", "Seung Byum Seo", "Vikram Sharma Mailthody", "Noor Michael", "Lan Li"),
            title="I-BERT: Inductive Generalization of Transformer to Arbitrary Context Lengths",
            year=2020,
            arxiv="2006.10220",
        ),
        pipeline_tag="fill-mask",
        auto_class="AutoModelForMaskedLM",
    ),
    "transformer_xl": FamilyCard(
        name="Transformer-XL",
        paper=Paper(
            authors=(
                "Zihang Dai",
                "Zhilin Yang",
                "Yiming Yang",
                "Jaime Carbonell",
                "Quoc V. Le",
                "Ruslan Salakhutdinov",
            ),
            title="Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context",
            year=2019,
            arxiv="1901.02860",
        ),
        pipeline_tag="text-generation",
        auto_class="AutoModelForCausalLM",
    ),
}


def family_card(config: PreTrainedConfig) -> FamilyCard:
    if config.model_type not in FAMILIES:
        raise ValueError(
            f"No model card facts for model_type={config.model_type!r}; known families: {sorted(FAMILIES)}"
        )
    return FAMILIES[config.model_type]


def base_model_of(config: PreTrainedConfig, repo_id: str) -> str | None:
    """The Hub checkpoint `config` was loaded (converted) from, if it came from the Hub and is not `repo_id` itself."""
    source = getattr(config, "_name_or_path", "") or ""
    if not source or source == repo_id or os.path.exists(source):
        return None
    try:
        validate_repo_id(source)
    except HFValidationError:
        return None
    return source


def model_card(
    model_or_config: PreTrainedModel | PreTrainedConfig,
    repo_id: str,
    *,
    base_model: str | None = None,
    eval_results: list[EvalResult] | None = None,
) -> ModelCard:
    """The model card (README.md with metadata) of a checkpoint of one of the package's families.

    Args:
        model_or_config (`PreTrainedModel` or `PreTrainedConfig`):
            The model, or its config, whose family, recurrence settings and origin the card describes.
        repo_id (`str`):
            The Hub repo the card is for; used in the title and the usage snippet.
        base_model (`str`, *optional*):
            The Hub checkpoint this one was converted or fine-tuned from. Defaults to the config's `_name_or_path`
            when that names a Hub repo (not a local folder) other than `repo_id`.
        eval_results (`list[huggingface_hub.EvalResult]`, *optional*):
            Evaluation results, written into the card's `model-index` metadata and an "Evaluation" table.
    """
    config = model_or_config.config if isinstance(model_or_config, PreTrainedModel) else model_or_config
    family = family_card(config)
    base_model = base_model or base_model_of(config, repo_id)
    # The installed config class lists its family's fields (a remote-code copy from an older release may not).
    settings = {name: getattr(config, name) for name in CONFIG_MAPPING[config.model_type].family_settings}
    data = ModelCardData(
        library_name="transformers",
        pipeline_tag=family.pipeline_tag,
        tags=["hf-recurrence", config.model_type, "custom_code", f"arxiv:{family.paper.arxiv}"],
        base_model=base_model,
        model_name=repo_id.split("/")[-1] if eval_results else None,
        eval_results=eval_results,
        recurrence_settings=settings or None,
    )
    sections = [
        _overview(repo_id, family, base_model),
        _settings_section(settings),
        _usage_section(repo_id, family),
        _evaluation_section(eval_results),
        f"## Citation\n\n```bibtex\n{family.paper.bibtex()}\n```\n",
    ]
    body = "\n".join(section for section in sections if section)
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}")


def _overview(repo_id: str, family: FamilyCard, base_model: str | None) -> str:
    paper = family.paper
    text = (
        f"# {repo_id.split('/')[-1]}\n\n"
        f"A checkpoint of the {family.name} of {paper.short_authors} ({paper.year}), [{paper.title}]({paper.url}), "
        "saved with the `hf-recurrence` package.\n"
    )
    if base_model:
        text += f"\nConverted from `{base_model}`.\n"
    return text


def _settings_section(settings: dict[str, object]) -> str:
    if not settings:
        return ""
    rows = [f"| `{name}` | `{value!r}` |" for name, value in settings.items()]
    return "## Recurrence settings\n\n| setting | value |\n| --- | --- |\n" + "\n".join(rows) + "\n"


def _usage_section(repo_id: str, family: FamilyCard) -> str:
    return (
        "## Usage\n\n"
        "The model code ships with the checkpoint, so `hf-recurrence` need not be installed; "
        "`trust_remote_code=True` runs the repo's `.py` files. Pin `revision=` to a commit sha to run exactly the "
        "code you reviewed.\n\n"
        "```python\n"
        f"from transformers import {family.auto_class}, pipeline\n\n"
        f'model = {family.auto_class}.from_pretrained("{repo_id}", trust_remote_code=True)\n'
        f'pipe = pipeline("{family.pipeline_tag}", model="{repo_id}", trust_remote_code=True)\n'
        "```\n\n"
        "The tokenizer is a standard one and needs no remote code: "
        f'`AutoTokenizer.from_pretrained("{repo_id}", trust_remote_code=False)` loads it without asking (without '
        "the argument, transformers first reads the model's config and asks whether to run its code, waiting 15 s "
        "for an answer in a terminal).\n"
    )


def _evaluation_section(eval_results: list[EvalResult] | None) -> str:
    if not eval_results:
        return ""
    rows = [
        f"| {result.dataset_name} | {result.metric_name or result.metric_type} | {result.metric_value} |"
        for result in eval_results
    ]
    return "## Evaluation\n\n| dataset | metric | value |\n| --- | --- | --- |\n" + "\n".join(rows) + "\n"


def write_model_card(
    folder: str | os.PathLike,
    repo_id: str,
    *,
    base_model: str | None = None,
    eval_results: list[EvalResult] | None = None,
) -> Path:
    """Write the model card of the checkpoint saved in `folder` to `folder/README.md` and return its path."""
    path = Path(folder) / "README.md"
    config = AutoConfig.from_pretrained(folder)
    model_card(config, repo_id, base_model=base_model, eval_results=eval_results).save(path)
    return path


def files_to_push(folder: Path) -> tuple[list[Path], list[Path]]:
    """The files of `folder` a model repo gets, and those left out (sorted paths).

    Only top-level files a model repo needs go up (`MODEL_REPO_FILES`): never a pickle (optimizer, scheduler and RNG
    states, `training_args.bin`, which holds `--hub_token` in clear when training was given one), never the
    `checkpoint-*` folders, logs or trainer state of a training run.
    """
    uploaded, left_out = [], []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder)
        if any(part.startswith(".") for part in relative.parts):
            continue
        top_level_model_file = len(relative.parts) == 1 and any(fnmatch(path.name, p) for p in MODEL_REPO_FILES)
        (uploaded if top_level_model_file else left_out).append(path)
    return uploaded, left_out


def _name_files(paths: list[Path], folder: Path) -> str:
    """One line naming `paths`: top-level files by name, folders by name and file count."""
    counts: dict[str, int] = {}
    for path in paths:
        top = path.relative_to(folder).parts[0]
        counts[top] = counts.get(top, 0) + 1
    return ", ".join(
        name if (folder / name).is_file() else f"{name}/ ({count} file{'s' * (count > 1)})"
        for name, count in counts.items()
    )


def push_folder(
    folder: str | os.PathLike,
    repo_id: str,
    *,
    base_model: str | None = None,
    eval_results: list[EvalResult] | None = None,
    revision: str | None = None,
    private: bool | None = None,
    token: str | None = None,
    commit_message: str = DEFAULT_COMMIT_MESSAGE,
) -> CommitInfo:
    """Upload a folder written by `save_pretrained` to `repo_id` in one commit, with a model card.

    Only what a model repo needs is uploaded (see `files_to_push`); what is left out is named in one warning. A
    folder whose weights are pickles only (`pytorch_model.bin`) is refused: load and `save_pretrained` it first.
    The folder's own README.md is uploaded as it is; without one, the card of `model_card` is added to the commit
    (the folder itself is not changed). The repo is created if needed, and the branch `revision` too.
    """
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise UsageError(f"{folder} is not a saved model folder: it has no config.json")
    uploaded, left_out = files_to_push(folder)
    if not any(fnmatch(path.name, "*.safetensors") for path in uploaded):
        pickled = sorted(path.name for path in folder.glob("*.bin"))
        raise UsageError(
            f"{folder} has no safetensors weights"
            + (f", only pickles ({', '.join(pickled)}), which are never uploaded" if pickled else "")
            + ": load the model with from_pretrained and save it with save_pretrained, which writes safetensors"
        )
    if left_out:
        logger.warning(f"Not uploaded from {folder} (not part of a model repo): {_name_files(left_out, folder)}")
    operations = [
        CommitOperationAdd(path_in_repo=path.relative_to(folder).as_posix(), path_or_fileobj=str(path))
        for path in uploaded
    ]
    if (folder / "README.md").exists():
        if base_model or eval_results:
            logger.warning(f"{folder} has its own README.md: base_model and eval_results are not added to it")
    else:
        card = model_card(
            AutoConfig.from_pretrained(folder), repo_id, base_model=base_model, eval_results=eval_results
        )
        operations.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=str(card).encode()))
    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    if revision is not None:
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    return api.create_commit(repo_id, operations, commit_message=commit_message, revision=revision)


def push_to_hub(
    model: PreTrainedModel,
    repo_id: str,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    base_model: str | None = None,
    eval_results: list[EvalResult] | None = None,
    revision: str | None = None,
    private: bool | None = None,
    token: str | None = None,
    commit_message: str = DEFAULT_COMMIT_MESSAGE,
) -> CommitInfo:
    """Push `model` (weights, config with the full `auto_map`, model code, generation config), `tokenizer` and a
    model card to `repo_id` in one commit, and return the commit.

    `base_model` defaults to the Hub checkpoint the model was loaded from (see `model_card`). `revision` names a
    branch, created from `main` if it does not exist.
    """
    with tempfile.TemporaryDirectory(prefix="hf_recurrence_push_") as folder:
        model.save_pretrained(folder)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        model_card(model, repo_id, base_model=base_model, eval_results=eval_results).save(Path(folder) / "README.md")
        return push_folder(
            folder, repo_id, revision=revision, private=private, token=token, commit_message=commit_message
        )


__all__ = [
    "FAMILIES",
    "MODEL_REPO_FILES",
    "FamilyCard",
    "Paper",
    "files_to_push",
    "model_card",
    "push_folder",
    "push_to_hub",
    "write_model_card",
]
