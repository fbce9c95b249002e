"""The reproduction pipelines, kept apart from the library: what `hf-recurrence reproduce` and `hf-recurrence
pretrain` run, and the experiments the scripts in the repository's `experiments/` folder record.

- `reproduction`: the paper's comparison on the embedded default GPT-2 (the project's main job);
- `book_reproduction`: the paper's claim on a real pretrained decoder (SmolLM2, Gemma 3) and Jane Austen's novels;
- `key_recall`: does the recurrence carry information across windows (the task is `hf_recurrence.data.key_recall`);
- `memory_gates`: which memory settings carry a key, or several bound facts, across windows (issue 39's gate 1);
- `memory_gate2`: the memory's gate 2, the planted-name probe as a training task on a pretrained decoder with LoRA
  (the task is `hf_recurrence.data.fact_probe`);
- `memory_gate3`: the memory's gate 3, the goals of a book run whose trained arms carry a memory (`--memory`);
- `pretraining`: the embedded default GPT-2 that `reproduction` starts from;
- `training`: the short stock-`Trainer` runs all of them share.

Nothing here is needed to load, train or share a model of the package: only the `reproduce` and `pretrain` commands
import it.
"""
