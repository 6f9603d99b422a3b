"""Every ```python block of python/README.md and of the repository's README.md is a complete
program: each runs as written, in a fresh interpreter, and exits 0 (numpy only, no GPU
needed; a block that imports torch or vLLM is skipped where it is not installed: the engines
environment of python/run-tests runs those)."""

import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest

PYTHON_DIR = pathlib.Path(__file__).resolve().parent.parent
READMES = {"python": PYTHON_DIR / "README.md", "root": PYTHON_DIR.parent / "README.md"}
BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)

# A block that imports one of these is skipped where it is not installed (ferry.sglang needs
# torch; ferry.vllm needs vLLM).
NEEDS = {"torch": re.compile(r"^\s*(import|from) (torch|ferry\.sglang)\b|^\s*import .*\btorch\b",
                             re.M),
         "vllm": re.compile(r"^\s*(import|from) (vllm|ferry\.vllm)\b", re.M)}


def blocks():
    params = []
    for name, path in READMES.items():
        if not path.exists():
            continue
        text = path.read_text()
        for i, m in enumerate(BLOCK.finditer(text)):
            line = text.count("\n", 0, m.start()) + 1
            marks = []
            for module, uses in NEEDS.items():
                if uses.search(m.group(1)) and importlib.util.find_spec(module) is None:
                    marks = [pytest.mark.skip(reason=f"the block uses {module}, which is not "
                                                     "installed")]
            params.append(pytest.param(path, m.group(1), id=f"{name}-{i}-line{line}",
                                       marks=marks))
    return params


def test_the_readmes_have_python_blocks():
    assert READMES["python"].exists()
    assert len(BLOCK.findall(READMES["python"].read_text())) >= 5


@pytest.mark.parametrize("path, code", blocks())
def test_readme_block_runs(tmp_path, path, code):
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, (f"{path} block exited {done.returncode}\n--- code\n{code}"
                                  f"\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
