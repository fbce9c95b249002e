# SPDX-License-Identifier: Apache-2.0
"""What the token a window starts with is worth to a stock pretrained decoder: windowed perplexity on a held-out
Austen book with nothing before each window, with the tokenizer's BOS token (else EOS), with that token and then
`reference_prompt`, and with the prompt alone, each against the bare window with a paired bootstrap interval; with
`--overlaps N ...`, also the bare window after the last N tokens of the window before (the same tokens predicted, N
more read): what a memory that kept the last tokens' own states at every layer could give a window, untrained.

The book reproduction's baseline reads bare windows and its reference rows read the prefixed ones; a model trained
always to see BOS first reads a bare window far worse, which every arm of the reproduction must then learn around.
Reads the validation book unless told otherwise: this is a check that informs choices, not a result on the test books.

    python experiments/window_start.py --model gemma3-270m --output-json experiments/results/window_start_gemma3.json
"""

import time

import _common as bench
import torch

from hf_recurrence.evaluation import WindowPrefixed, windowed_perplexity
from hf_recurrence.experiments.book_reproduction import (
    NAMED_MODELS,
    BookReproductionSettings,
    compare,
    describe,
    held_out_documents,
    load_causal_lm,
    reference_prefixes,
)


def main() -> None:
    parser = bench.benchmark_parser(__doc__, __file__, cuda_dtype="float32", seed=False)
    parser.add_argument(
        "--model",
        default="gemma3-270m",
        help=f"an installed model ({', '.join(sorted(NAMED_MODELS))}), or a stock causal LM's folder or .gguf file",
    )
    parser.add_argument("--eval-split", choices=["validation", "test"], default="validation")
    parser.add_argument("--eval-tokens-per-book", type=int, default=4000, help="first tokens of each book read")
    parser.add_argument("--window-size", type=int, default=128)
    parser.add_argument(
        "--overlaps", type=int, nargs="*", default=[], help="bare windows also read after this many earlier tokens"
    )
    args = parser.parse_args()
    if any(not 0 < overlap < args.window_size for overlap in args.overlaps):
        parser.error(f"--overlaps {args.overlaps}: each must be at least 1 and below --window-size {args.window_size}")
    device, dtype, machine = bench.start(args)
    settings = BookReproductionSettings(
        model_name_or_path=args.model,
        eval_split=args.eval_split,
        eval_tokens_per_book=args.eval_tokens_per_book,
        window_size=args.window_size,
    )
    try:
        model, tokenizer, source = load_causal_lm(settings.model_name_or_path)
    except (ImportError, OSError) as error:  # a model package not installed, a path that holds no model
        parser.error(f"--model {args.model}: {error}")
    model = model.to(device, dtype).eval()
    documents, read = held_out_documents(settings, tokenizer)
    bos = reference_prefixes(tokenizer, settings).get("stock+bos", [])
    prompt = tokenizer(settings.reference_prompt, add_special_tokens=False)["input_ids"]
    prefixes = {"bare window": None, "BOS": bos, "BOS + prompt": bos + prompt, "prompt alone": prompt}
    prefixes = {name: prefix for name, prefix in prefixes.items() if prefix is None or prefix}
    # Each read: (its prefix, the earlier tokens it reads before each window).
    reads = {name: (prefix, 0) for name, prefix in prefixes.items()}
    reads |= {f"bare window after the last {n} tokens before it": (None, n) for n in args.overlaps}

    rows, token_nll, values = [], {}, {"source": source, "held_out": read, "perplexity": {}, "comparisons": {}}
    for name, (prefix, overlap) in reads.items():
        start = time.perf_counter()
        reader = model if prefix is None else WindowPrefixed(model, prefix)
        with torch.no_grad():
            result = windowed_perplexity(
                reader, documents, settings.window_size, overlap, batch_size=len(documents), return_token_nll=True
            )
        seconds = time.perf_counter() - start
        token_nll[name] = result.token_nll
        values["perplexity"][name] = result.perplexity
        comparison = None if name == "bare window" else compare(token_nll, "bare window", name, settings)
        values["comparisons"][name] = comparison
        versus = "–" if comparison is None else describe(comparison).split(": ", 1)[1]
        rows.append([name, 0 if prefix is None else len(prefix), f"{result.perplexity:.2f}", versus, f"{seconds:.0f}"])
        print(f"{name}: perplexity {result.perplexity:.2f}", flush=True)
    table = bench.table(
        ["window start", "prefix tokens", "perplexity", "vs bare window", "seconds"],
        rows,
        align=["", "right", "right", "", "right"],
    )
    books = ", ".join(
        f"{book['title']} (first {book['tokens_read']:,} of {book['book_tokens']:,} tokens)" for book in read
    )
    tokens = sum(len(document) - 1 for document in documents)
    run = [
        f"{source}, stock, {bench.dtype_name(dtype)} on {device}; windows of {settings.window_size} (overlap 0 unless the row says otherwise) over "
        f"{books}, {settings.eval_passages_per_book} passages per book ({tokens:,} predicted tokens); "
        f'prompt: "{settings.reference_prompt}"'
    ]
    bench.write_results(args, machine, {"window_start": table}, values, {"run": run})


if __name__ == "__main__":
    main()
