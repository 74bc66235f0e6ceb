"""Every name a notebook's code cell reads is defined by a cell above it (or is a builtin): a cell that moved
into a helper must not take with it an import that a later cell still needs. Read statically (ast), top to bottom,
so it holds for the cells a CPU run skips too (a GPU-only cell fails only on a GPU otherwise)."""
import ast
import builtins
import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
IPYTHON = {"get_ipython", "display", "In", "Out", "_", "__", "___", "exit", "quit"}


def code_cells(path):
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] == "code":
            lines = ["" if l.lstrip().startswith(("%", "!")) else l for l in "".join(cell["source"]).splitlines()]
            yield i, "\n".join(lines)


def bound_names(tree):
    """Names a cell binds at its top level (assignments, imports, defs, loops, with, except, walrus)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
            out |= {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)} if hasattr(node, "args") else set()
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.alias):
            out.add((node.asname or node.name).split(".")[0])
    return out


def unbound_reads(path):
    known = set(dir(builtins)) | IPYTHON
    missing = []
    for i, src in code_cells(path):
        tree = ast.parse(src)
        here = bound_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in known | here:
                missing.append(f"cell {i}: {node.id}")
        known |= here
    return missing


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_name_a_cell_reads_is_defined_above_it(notebook):
    assert not unbound_reads(notebook), f"{notebook.name}: names read before any cell defines them"


def test_a_name_whose_import_moved_away_is_found(tmp_path):
    nb = {"cells": [{"cell_type": "code", "source": ["import tutorial_lib as tl\n", "x = tl.f()"]},
                    {"cell_type": "code", "source": ["%matplotlib inline\n", "plt.plot(x)"]}]}
    (tmp_path / "n.ipynb").write_text(json.dumps(nb))
    assert unbound_reads(tmp_path / "n.ipynb") == ["cell 1: plt"]
