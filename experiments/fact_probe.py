"""The long-range probe on SmolLM2 (issue: the paper's protocol on real models), frozen vs LoRA side by side.

What is measured and how: docs/experiments/fact_probe.md.

    python experiments/fact_probe.py --backbones frozen lora --max-steps 100
"""

import json
import time
from dataclasses import asdict

import _common as bench

from hf_recurrence.data import austen_split, token_stream
from hf_recurrence.experiments.book_reproduction import (
    BACKBONE_SETTINGS,
    RECURRENCE_INITS,
    BookReproductionSettings,
    load_causal_lm,
    run_fact_probe,
)


def main() -> None:
    # The arms' quality is what is measured: float32 (the Trainer's) on CUDA too.
    parser = bench.benchmark_parser(__doc__, __file__, cuda_dtype="float32", seed=False)
    parser.add_argument("--backbones", nargs="+", default=["frozen", "lora"], choices=BACKBONE_SETTINGS)
    parser.add_argument("--max-steps", type=int, default=100, help="optimizer steps per arm")
    parser.add_argument("--batch-size", type=int, default=4, help="probe examples per step")
    parser.add_argument("--window-size", type=int, default=128)
    parser.add_argument("--held-out", type=int, default=64, help="validation-book examples scored")
    parser.add_argument(
        "--model-name-or-path", default=None, help="a causal LM folder, .gguf, smollm2-135m or gemma3-270m"
    )
    parser.add_argument("--bf16", action="store_true", help="train under bfloat16 autocast")
    parser.add_argument(
        "--recurrence-init", default="model", choices=RECURRENCE_INITS, help="how the recurrence FFN starts"
    )
    args = parser.parse_args()
    bench.setup(0, args.threads)
    device, dtype = bench.trainer_device(args, "the arms are trained by the Trainer, on its device in float32")
    machine = bench.describe_machine(device, dtype)
    start = time.perf_counter()
    llama, tokenizer, source = load_causal_lm(args.model_name_or_path)
    llama.to(device).requires_grad_(False)
    train_stream = token_stream([book.text for book in austen_split("train")], tokenizer)
    validation_stream = token_stream([book.text for book in austen_split("validation")], tokenizer)
    results = []
    for backbone in args.backbones:
        settings = BookReproductionSettings(
            model_name_or_path=args.model_name_or_path,
            window_size=args.window_size,
            max_steps=args.max_steps,
            batch_size=args.batch_size,
            backbone=backbone,
            bf16=args.bf16,
            recurrence_init=args.recurrence_init,
            eval_split="validation",
        )
        result = run_fact_probe(llama, tokenizer, train_stream, validation_stream, settings, args.held_out)
        results.append({"settings": asdict(settings), **result})
        print(f"[{backbone}] {json.dumps({k: result[k] for k in ('stock', 'recurrent', 'swapped')})}")
    rows = [
        [r["backbone"], *(f"{r[k]['name_nll']:.3f} / {100 * r[k]['recalled']:.0f}%" for k in ("stock", "recurrent", "swapped")),
         f"{r['train_minutes']:.1f}"]
        for r in results
    ]  # fmt: skip
    headers = [
        "backbone",
        "stock, question window alone",
        "recurrent",
        "recurrent, another example's `h_prev`",
        "train minutes",
    ]
    findings = [
        f"Model {source}; {(time.perf_counter() - start) / 60:.1f} minutes in all. Cells: mean NLL per name token "
        "(nats) / examples whose every name token is the argmax."
    ]
    bench.write_results(
        args, machine, {"probe": bench.table(headers, rows)}, {"results": results}, {"notes": findings}
    )


if __name__ == "__main__":
    main()
