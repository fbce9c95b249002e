"""Sharing on the Hugging Face Hub: model cards and pushes that load anywhere with `trust_remote_code=True`.

What a card says about a family's paper and pipeline comes from the package's one family list
(`hf_recurrence.families.FAMILIES`); the config fields it lists as the family's settings come from the config class
(`family_settings`).
"""

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

from huggingface_hub import CommitInfo, CommitOperationAdd, EvalResult, HfApi, ModelCard, ModelCardData
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig, PreTrainedConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.dynamic_module_utils import get_relative_import_files
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.utils import logging

from .families import FAMILIES, Family
from .outputs import TOKENIZER_FILES, UsageError


logger = logging.get_logger(__name__)

# The top-level files of a checkpoint that `push_folder` uploads besides the code `auto_map` names and the weight
# shards an index names: exact names, never a pattern, so that nothing else in the folder (a script, a key file, a
# saved recurrent state) goes up without being asked for.
CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "adapter_config.json",
    "adapter_model.safetensors",
    *TOKENIZER_FILES,
    "README.md",
)
# Pickles run code when loaded and may hold secrets (`training_args.bin` holds `--hub_token` in clear): never uploaded,
# even when an --include pattern matches them.
PICKLE_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.pkl", "*.pickle", "*.ckpt")
# Why a symlink is left out: uploading reads its target, and a link to ~/.bashrc would publish it.
OUTSIDE_LINK = "a symlink pointing out of the folder"
LOOPED_LINK = "a symlink loop, which points at no file"
# The safetensors metadata key of a saved recurrent state (the models' `_STATE_HEADER_KEY`).
STATE_HEADER_KEY = "hf_recurrence_state"

DEFAULT_COMMIT_MESSAGE = "Upload model with hf-recurrence"


def family_card(config: PreTrainedConfig) -> Family:
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


def _overview(repo_id: str, family: Family, base_model: str | None) -> str:
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


def _usage_section(repo_id: str, family: Family) -> str:
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


@dataclass
class PushPlan:
    """What `push_folder` uploads from a folder, and what it leaves out with the reason for each file."""

    folder: Path
    uploaded: list[Path]
    left_out: dict[Path, str]

    def describe_uploaded(self) -> str:
        names = [path.relative_to(self.folder).as_posix() for path in self.uploaded]
        if "README.md" not in names:
            names.append("README.md (the model card, written for this push)")
        return f"Uploading from {self.folder}: {', '.join(names)}"

    def describe_left_out(self) -> str:
        by_reason: dict[str, list[Path]] = {}
        for path, reason in self.left_out.items():
            by_reason.setdefault(reason, []).append(path)
        return "\n".join(
            f"Not uploaded from {self.folder} ({reason}): {_name_files(paths, self.folder)}"
            for reason, paths in by_reason.items()
        )


def _code_files(folder: Path) -> set[str]:
    """The `.py` files the checkpoint's `auto_map`s name (config and tokenizer), with the sibling files they import."""
    names = set()
    for source in ("config.json", "tokenizer_config.json"):
        path = folder / source
        auto_map = json.loads(path.read_text()).get("auto_map") if path.is_file() else None
        for value in (auto_map or {}).values():
            # Tokenizer entries are [slow, fast] pairs; "repo_id--module.Class" names code in another repo.
            for reference in value if isinstance(value, list) else [value]:
                if isinstance(reference, str) and "--" not in reference:
                    names.add(reference.rsplit(".", 1)[0] + ".py")
    found = {name for name in names if (folder / name).is_file()}
    for name in list(found):
        found.update(Path(sibling).name for sibling in get_relative_import_files(folder / name))
    return found


def _weight_shards(folder: Path) -> set[str]:
    """The shard files `model.safetensors.index.json` names."""
    index = folder / "model.safetensors.index.json"
    return set(json.loads(index.read_text()).get("weight_map", {}).values()) if index.is_file() else set()


def _is_state_file(path: Path) -> bool:
    """Whether `path` is a recurrent state written by `state.save()` (it holds the text the model read)."""
    try:
        with safe_open(str(path), framework="pt") as file:
            return STATE_HEADER_KEY in (file.metadata() or {})
    except (SafetensorError, OSError):
        return False


def files_to_push(folder: str | os.PathLike, include: Sequence[str] = ()) -> PushPlan:
    """What `push_folder` uploads from `folder`: exactly the files a checkpoint needs, and what it leaves out.

    Uploaded: the code files that the `auto_map` of `config.json` / `tokenizer_config.json` names and the sibling
    files they import; the top-level `CHECKPOINT_FILES` (config and generation config, weights and their index,
    PEFT's adapter files, tokenizer files, the model card) and the weight shards the index names; and any file whose
    path in the folder matches an `include` glob pattern. A saved recurrent state holds the text the model read: it
    goes up only when an `include` entry is its exact path. Never uploaded: a pickle (`PICKLE_PATTERNS`), a hidden
    file, a symlink that points out of the folder or into a loop. Raises `UsageError` for a folder without config.json
    or without safetensors weights.
    """
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise UsageError(f"{folder} is not a saved model folder: it has no config.json")
    root = folder.resolve()
    shards = _weight_shards(folder)
    needed = {*CHECKPOINT_FILES, *_code_files(folder), *shards}
    uploaded, left_out = [], {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() or p.is_symlink()):
        relative = path.relative_to(folder)
        name = relative.as_posix()
        if any(part.startswith(".") for part in relative.parts):
            continue
        try:
            target = path.resolve()
        except (RuntimeError, OSError):
            # A symlink loop (RuntimeError before Python 3.13, OSError since): there is no file to upload.
            left_out[path] = LOOPED_LINK
            continue
        if not target.is_relative_to(root) or not path.exists():
            left_out[path] = OUTSIDE_LINK
        elif not path.is_file():
            # A link to a folder inside this one: its files are listed under their own paths.
            continue
        elif any(fnmatch(path.name, pattern) for pattern in PICKLE_PATTERNS):
            left_out[path] = "a pickle, never uploaded"
        elif path.suffix == ".safetensors" and name not in include and _is_state_file(path):
            left_out[path] = "a saved recurrent state, which holds the text it read; --include its exact name"
        elif name in needed or any(fnmatch(name, pattern) for pattern in include):
            uploaded.append(path)
        else:
            left_out[path] = "not part of the checkpoint; --include a pattern to add it"
    weights = {"model.safetensors", "adapter_model.safetensors", *shards}
    if not any(path.parent == folder and path.name in weights for path in uploaded):
        linked = sorted(
            path.name for path, reason in left_out.items() if reason == OUTSIDE_LINK and path.name in weights
        )
        if linked:
            raise UsageError(
                f"{folder}'s weights ({', '.join(linked)}) are symlinks pointing out of the folder, which a push never "
                "follows: copy the files themselves into the folder (or save_pretrained the model there)"
            )
        pickled = sorted(path.name for path in folder.glob("*.bin"))
        raise UsageError(
            f"{folder} has no safetensors weights"
            + (f", only pickles ({', '.join(pickled)}), which are never uploaded" if pickled else "")
            + ": load the model with from_pretrained and save it with save_pretrained, which writes safetensors"
        )
    return PushPlan(folder, uploaded, left_out)


def _name_files(paths: list[Path], folder: Path) -> str:
    """One line naming `paths`: top-level files by name, folders by name and file count."""
    counts: dict[str, int] = {}
    for path in paths:
        top = path.relative_to(folder).parts[0]
        counts[top] = counts.get(top, 0) + 1
    return ", ".join(
        f"{name}/ ({count} file{'s' * (count > 1)})" if (folder / name).is_dir() else name
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
    include: Sequence[str] = (),
) -> CommitInfo:
    """Upload a folder written by `save_pretrained` to `repo_id` in one commit, with a model card.

    Only the files a checkpoint needs are uploaded, plus those matching the glob patterns `include` (see
    `files_to_push`); what is left out is named in one warning, with the reasons. A folder whose weights are pickles
    only (`pytorch_model.bin`) is refused: load and `save_pretrained` it first.
    The folder's own README.md is uploaded as it is; without one, the card of `model_card` is added to the commit
    (the folder itself is not changed). The repo is created if needed, and the branch `revision` too.
    """
    folder = Path(folder)
    plan = files_to_push(folder, include)
    if plan.left_out:
        logger.warning(plan.describe_left_out())
    uploaded = plan.uploaded
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
    "CHECKPOINT_FILES",
    "FAMILIES",
    "PICKLE_PATTERNS",
    "PushPlan",
    "files_to_push",
    "model_card",
    "push_folder",
    "push_to_hub",
    "write_model_card",
]
