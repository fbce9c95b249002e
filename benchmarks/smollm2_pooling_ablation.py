"""Does normalising the pooled hidden states help the recurrence on SmolLM2? Measured on the validation book.

The `smollm2` reproduction pools unit-RMS token states (`normalize_pooled_states=True`, chosen from the activation
measurement on the model page). This trains the same recurrent arm with the paper's plain mean instead, at the same
settings, and compares it with the reproduction's own trained arms (their saved recurrence weights) on *Sense &
Sensibility*, the validation book, never the test books:

    python benchmarks/smollm2_pooling_ablation.py --reproduction-dir outputs/smollm2 --write-docs
"""

import argparse
import json
import time
from pathlib import Path

from _common import load_at_end, machine_info, markdown_table, setup, write_section
from safetensors.torch import load_file

from hf_recurrence.book_reproduction import (
    TRAINED_ARMS,
    BookReproductionSettings,
    compare,
    describe,
    held_out_documents,
    load_llama,
    train_arm,
)
from hf_recurrence.data import austen_split, token_stream
from hf_recurrence.evaluation import windowed_perplexity
from hf_recurrence.smollm2 import recurrent_llama_from_llama


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reproduction-dir", type=Path, required=True, help="a finished --preset smollm2 run")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    setup(0, args.threads)
    info = machine_info()
    start = time.perf_counter()
    report = json.loads((args.reproduction_dir / "results.json").read_text())
    settings = BookReproductionSettings(**{**report["settings"], "eval_split": "validation"})
    llama, tokenizer, _ = load_llama(settings.model_name_or_path)
    llama.requires_grad_(False)
    documents, read = held_out_documents(settings, tokenizer)
    token_nll, perplexity = {}, {}

    def evaluate(model, name: str) -> None:
        result = windowed_perplexity(model, documents, settings.window_size, 0, return_token_nll=True)
        token_nll[name], perplexity[name] = result.token_nll, result.perplexity
        print(f"{name}: perplexity {result.perplexity:.3f}")

    evaluate(llama, "baseline")
    for arm, recurrence_input in TRAINED_ARMS.items():
        model = recurrent_llama_from_llama(llama, **settings.recurrence_settings(), recurrence_input=recurrence_input)
        model.model.recurrence.load_state_dict(load_file(args.reproduction_dir / f"recurrence_{arm}.safetensors"))
        evaluate(model, f"{arm} (normalized)" if arm == "recurrent" else arm)
    stream = token_stream([book.text for book in austen_split("train")], tokenizer)
    plain_settings = BookReproductionSettings(**{**report["settings"], "normalize_pooled_states": False})
    model, _, minutes = train_arm(llama, "window", stream, plain_settings)
    evaluate(model, "recurrent (plain mean)")

    comparisons = [
        compare(token_nll, "baseline", "recurrent (normalized)", settings),
        compare(token_nll, "baseline", "recurrent (plain mean)", settings),
        compare(token_nll, "control", "recurrent (normalized)", settings),
        compare(token_nll, "control", "recurrent (plain mean)", settings),
        compare(token_nll, "recurrent (plain mean)", "recurrent (normalized)", settings),
    ]
    for comparison in comparisons:
        print(describe(comparison))
    if args.write_docs:
        table = markdown_table(["arm", "validation perplexity"], [[k, f"{v:.3f}"] for k, v in perplexity.items()])
        book = read[0]
        write_section(
            "smollm2_pooling_ablation",
            f"""## SmolLM2 recurrence: normalised vs plain pooling (`smollm2_pooling_ablation.py`)

The `smollm2` reproduction's recurrent and control arms (their saved recurrence weights) beside a recurrent arm
trained with the paper's plain mean of the hidden states (`normalize_pooled_states=False`), everything else the
same ({plain_settings.max_steps} steps, {report["train_tokens_per_arm"]:,} tokens; training took {minutes:.1f}
minutes), read at overlap 0 on the validation book, *{book["title"]}* (first {book["tokens_read"]:,} tokens), never a
test book. {time.perf_counter() - start:.0f} s in all. {args.note}

Machine: {info}; {load_at_end()}.

{table}

{chr(10).join(f"- {describe(c)}" for c in comparisons)}

`python benchmarks/smollm2_pooling_ablation.py --reproduction-dir <the smollm2 run> --write-docs`
""",
        )


if __name__ == "__main__":
    main()
