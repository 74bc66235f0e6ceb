"""The package reads in layers (docs/architecture.md): no import circle, no upward import, and the modules a
login node needs never import torch."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "tutorial_lib"
LAYER = {
    "config": 0, "shapes": 0, "intervals": 0, "peaks": 0,
    "results": 1,
    "sites": 2, "slurm": 2, "meters": 3, "precision": 2, "trace_summary": 2, "reference": 2, "tensorboard": 2, "models": 2, "distributed": 2,
    "stepgraph": 2, "buckets": 3, "checkpoint": 2, "history": 2, "launcher": 3, "sweeps": 3,
    "jobs": 4, "imagefolder": 3,
    "data": 4, "profiling": 4,
    "engine": 5, "roofline": 5,
    "bench": 6, "ladder": 6, "scaling": 6, "sitecheck": 6,
    "notebook": 7, "report": 7, "doctor": 7,
    "__main__": 8, "__init__": 8,
}
TORCH_FREE = ("config", "results", "sites", "jobs", "slurm", "trace_summary", "intervals", "reference", "shapes",
              "peaks", "history", "sweeps")
MODULES = sorted(p.stem for p in PKG.glob("*.py"))


def imports(module: str) -> set[str]:
    """The package modules `module` imports, at the top or inside a function."""
    tree = ast.parse((PKG / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tutorial_lib."):
            found.add(node.module.split(".")[1])
    return found & set(LAYER) - {module}


def test_every_module_has_a_layer():
    missing = [m for m in MODULES if m not in LAYER]
    assert not missing, f"add {missing} to LAYER here and to the table in docs/architecture.md"


@pytest.mark.parametrize("module", MODULES)
def test_no_upward_import(module):
    if module == "__init__":
        return  # the package's lazy attributes may name any submodule
    up = {m: LAYER[m] for m in imports(module) if LAYER[m] >= LAYER[module]}
    assert not up, f"{module} (layer {LAYER[module]}) imports {up}: move the shared piece down a layer"


def test_no_import_circle():
    graph = {m: imports(m) for m in MODULES if m != "__init__"}
    state = {}

    def visit(m, path):
        state[m] = "open"
        for d in graph.get(m, ()):
            assert state.get(d) != "open", "import circle: " + " -> ".join(path + [d])
            if d not in state:
                visit(d, path + [d])
        state[m] = "done"

    for m in graph:
        if m not in state:
            visit(m, [m])


def test_the_login_node_modules_do_not_import_torch():
    code = ("import sys, importlib\n"
            f"for m in {TORCH_FREE!r}:\n"
            "    importlib.import_module('tutorial_lib.' + m)\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=PKG.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "one of the torch-free modules imports torch at import time"


def test_docs_table_names_every_module():
    text = (PKG.parent / "docs" / "architecture.md").read_text()
    missing = [m for m in MODULES if f"`{m}.py`" not in text]
    assert not missing, f"docs/architecture.md does not describe {missing}"


@pytest.mark.parametrize("module", MODULES)
def test_modules_and_functions_stay_readable(module):
    source = (PKG / f"{module}.py").read_text()
    assert len(source.splitlines()) <= 540, f"{module}.py is over ~500 lines: split it by concern"
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            size = node.end_lineno - node.lineno + 1
            assert size <= 70, f"{module}.{node.name} is {size} lines: split it"
