"""The CLI starts without the training stack: no torch, deepspeed, vLLM (nor numpy) at import."""

import subprocess
import sys


def test_cli_imports_no_heavy_module():
    code = ("import sys, scalectl.cli; "
            "print(','.join(m for m in ('torch', 'deepspeed', 'vllm', 'numpy', 'scipy', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""
