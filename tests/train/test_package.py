"""The train package: importing it costs no torch; its torch modules name the extra."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_package_loads_no_torch() -> None:
    code = "import sys, osmosis_ai.train; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_without_torch_the_error_names_the_train_extra() -> None:
    # A None entry in sys.modules makes `import torch` fail as if it were not installed.
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "try:\n"
        "    import osmosis_ai.train.grpo\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "pip install 'osmosis-ai[train]'" in result.stdout
