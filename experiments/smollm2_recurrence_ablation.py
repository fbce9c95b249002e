"""One recurrence setting changed on SmolLM2, measured on the validation book (never the test books).

Trains the `smollm2` reproduction's recurrent arm again with one `RecurrentLlamaConfig` field changed (everything
else, the blocks and their order included, the same), and compares it with that reproduction's own trained arms
(their saved recurrence weights) and the stock model on *Sense & Sensibility*, at overlap 0, with paired bootstrap
intervals. Used to choose the RoPE policy of the `h_prev` key (`h_prev_rope_position`) and the pooling
(`normalize_pooled_states`):

    python experiments/smollm2_recurrence_ablation.py --reproduction-dir outputs/smollm2 \
        --change h_prev_rope_position=-1 --write-docs
"""

import argparse
import json
import time
from pathlib import Path

import _common as bench
from safetensors.torch import load_file

from hf_recurrence import RecurrentLlamaConfig
from hf_recurrence.data import austen_split, token_stream
from hf_recurrence.evaluation import windowed_perplexity
from hf_recurrence.experiments.book_reproduction import (
    TRAINED_ARMS,
    BookReproductionSettings,
    compare,
    describe,
    held_out_documents,
    load_causal_lm,
    recurrent_arm,
    train_arm,
)


def parse_change(text: str) -> tuple[str, object]:
    """`FIELD=VALUE` with VALUE read as JSON (`-1`, `false`, `null`), else as a string."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE, got {text!r}")
    name, value = text.split("=", 1)
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def main() -> None:
    # Trained arms compare like for like only in the reproduction's float32.
    parser = bench.benchmark_parser(__doc__, __file__, cuda_dtype="float32", seed=False)
    parser.add_argument("--reproduction-dir", type=Path, required=True, help="a finished --preset smollm2 run")
    parser.add_argument("--change", type=parse_change, required=True, help="FIELD=VALUE of RecurrentLlamaConfig")
    args = parser.parse_args()
    bench.setup(0, args.threads)
    # Trained arms compare like for like only in the reproduction's float32, on the device its Trainer picked.
    device, dtype = bench.trainer_device(
        args, "the arms are compared with the reproduction's and must be trained the same way"
    )
    machine = bench.describe_machine(device, dtype)
    start = time.perf_counter()
    report = json.loads((args.reproduction_dir / "results.json").read_text())
    settings = BookReproductionSettings(**{**report["settings"], "eval_split": "validation"})
    name, value = args.change
    changed_arm = f"recurrent, {name}={json.dumps(value)}"
    llama, tokenizer, _ = load_causal_lm(settings.model_name_or_path)
    # Every arm is built on this model's device: the stock model's evaluation runs where the trained arms' does.
    llama.to(device).requires_grad_(False)
    documents, read = held_out_documents(settings, tokenizer)
    token_nll, perplexity = {}, {}

    def evaluate(model, arm: str) -> None:
        result = windowed_perplexity(model, documents, settings.window_size, 0, return_token_nll=True)
        token_nll[arm], perplexity[arm] = result.token_nll, result.perplexity
        print(f"{arm}: perplexity {result.perplexity:.3f}")

    evaluate(llama, "baseline")
    for arm, recurrence_input in TRAINED_ARMS.items():
        model = recurrent_arm(llama, **settings.recurrence_settings(), recurrence_input=recurrence_input)
        model.recurrence.load_state_dict(load_file(args.reproduction_dir / f"recurrence_{arm}.safetensors"))
        evaluate(model, arm)
    stream = token_stream([book.text for book in austen_split("train")], tokenizer)
    model, _, minutes = train_arm(llama, "window", stream, settings, **{name: value})
    evaluate(model, changed_arm)

    comparisons = [
        compare(token_nll, "baseline", "recurrent", settings),
        compare(token_nll, "baseline", changed_arm, settings),
        compare(token_nll, "control", "recurrent", settings),
        compare(token_nll, "control", changed_arm, settings),
        compare(token_nll, changed_arm, "recurrent", settings),
    ]
    book = read[0]
    baseline_value = report["settings"].get(name, getattr(RecurrentLlamaConfig, name))
    text = {
        "run": [
            f"The `recurrent` arm has `{name}={json.dumps(baseline_value)}`; the changed arm trained for {minutes:.1f} "
            f"minutes on {report['train_tokens_per_arm']:,} tokens; read on *{book['title']}* (first "
            f"{book['tokens_read']:,} tokens). {time.perf_counter() - start:.0f} s in all. {args.note}".rstrip()
        ],
        "intervals": [f"- {describe(c)}" for c in comparisons],
    }
    table = bench.table(["arm", "validation perplexity"], [[k, f"{v:.3f}"] for k, v in perplexity.items()])
    values = {"perplexity": perplexity, "comparisons": comparisons, "train_minutes": minutes}
    bench.write_results(args, machine, {"perplexity": table}, values, text, change={name: value})


if __name__ == "__main__":
    main()
