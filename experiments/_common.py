# SPDX-License-Identifier: Apache-2.0
"""The experiment scripts' `import _common` gets benchmarks/_common.py, the one harness both folders share
(arguments, machine description, the JSON result file, rendering): this file only hands that module over.

`python experiments/<name>.py` puts this folder first on `sys.path`, so `import _common` runs this file; it puts
benchmarks/ on `sys.path` too (for the harness's own `import render`), loads the harness, and leaves it in
`sys.modules["_common"]`, which the import statement then returns in place of this module.
"""

import importlib.util
import sys
from pathlib import Path


BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(1, str(BENCHMARKS))
_spec = importlib.util.spec_from_file_location("_common", BENCHMARKS / "_common.py")
_harness = importlib.util.module_from_spec(_spec)
sys.modules["_common"] = _harness
_spec.loader.exec_module(_harness)
