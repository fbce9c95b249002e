"""`utils/check_copies.py`: every `# Copied from` block in the model folders equals its original, and drift is caught."""

import importlib.util
import subprocess
import sys

from .common import REPO_ROOT


CHECKER = REPO_ROOT / "utils" / "check_copies.py"
spec = importlib.util.spec_from_file_location("check_copies", CHECKER)
check_copies = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_copies)

ORIGINAL = "hf_recurrence.models.recurrent_decoder.modeling_recurrent_decoder"
STATE_ORIGINAL = "hf_recurrence.models.recurrent_decoder.state_recurrent_decoder"


def test_every_copy_in_the_model_folders_matches():
    count, problems = check_copies.check_all()
    assert problems == []
    assert count >= 15  # Transformer-XL's copies of the recurrence core


def test_the_script_exits_nonzero_on_drift(tmp_path):
    assert subprocess.run([sys.executable, str(CHECKER)], capture_output=True).returncode == 0
    drifted = tmp_path / "modeling_drifted.py"
    drifted.write_text(
        f"# Copied from {ORIGINAL}._concat_layers\ndef _concat_layers(per_step, dim):\n    return tuple(per_step)\n"
    )
    count, problems = check_copies.check_all(tmp_path)
    assert count == 1
    assert problems == [f"{drifted}:1: differs from {ORIGINAL}._concat_layers"]


def test_replacements_are_applied_and_a_missing_original_is_named(tmp_path):
    def holder(return_type: str) -> str:
        return (
            "class Holder:\n"
            f"    # Copied from {STATE_ORIGINAL}.RecurrentDecoderState.detach with RecurrentDecoder->Other\n"
            f'    def detach(self) -> "{return_type}":\n'
            '        """Cut the autograd history of every tensor (truncated BPTT between calls). Returns `self`."""\n'
            "        return self._map(torch.Tensor.detach)\n"
        )

    (tmp_path / "modeling_renamed.py").write_text(holder("OtherState"))
    assert check_copies.check_all(tmp_path) == (1, [])
    (tmp_path / "modeling_renamed.py").write_text(
        holder("RecurrentDecoderState") + f"# Copied from {ORIGINAL}.NoSuchThing\ndef thing():\n    pass\n"
    )
    _, problems = check_copies.check_all(tmp_path)
    assert len(problems) == 2
    assert problems[0].endswith(
        f"differs from {STATE_ORIGINAL}.RecurrentDecoderState.detach with RecurrentDecoder->Other"
    )
    assert problems[1].endswith(f"{ORIGINAL}.NoSuchThing does not exist")


def test_fix_rewrites_a_drifted_copy_from_its_original_and_keeps_the_rest(tmp_path):
    drifted = tmp_path / "modeling_drifted.py"
    drifted.write_text(
        "import torch\n\n\n"
        "class Holder:\n"
        f"    # Copied from {STATE_ORIGINAL}.RecurrentDecoderState.detach with RecurrentDecoder->Other\n"
        '    def detach(self) -> "OtherState":\n'
        "        return self\n\n"
        "    def kept(self) -> int:\n"
        "        return 1\n"
    )
    assert check_copies.fix_all(tmp_path) == 1
    assert check_copies.check_all(tmp_path) == (1, [])
    text = drifted.read_text()
    assert "return self._map(torch.Tensor.detach)" in text
    assert text.startswith("import torch\n") and text.endswith("    def kept(self) -> int:\n        return 1\n")
    assert check_copies.fix_all(tmp_path) == 0
