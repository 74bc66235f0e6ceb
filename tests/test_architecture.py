"""The package reads in tiers (docs/architecture.md, its table under "## Tiers", the one source of the rules):
every import goes to the module's own tier or to a tier its row names, no import circle, the torch-free tiers
never import torch, and no module or function outgrows a screen. The GPU scripts only launch the package."""
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "tutorial_lib"
DOC = ROOT / "docs" / "architecture.md"
MODULES = sorted(".".join(p.relative_to(PKG).with_suffix("").parts) for p in PKG.rglob("*.py"))
MAX_LINES, MAX_FUNCTION = 500, 60
GPU_SCRIPTS = ROOT / "scripts" / "gpu"


def tiers(text: str) -> dict[str, dict]:
    """tier -> {"modules": [...], "imports": {tiers}, "torch_free": bool}, from the doc's Tiers table."""
    section = text.split("## Tiers", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("|") and not r.startswith("| ---")][1:]
    out = {}
    for row in rows:
        tier, modules, imports, torch_free = (c.strip() for c in row.strip("|").split("|"))
        name = tier.split()[0]
        out[name] = {"modules": re.findall(r"`([\w/*]+)`", modules), "imports_raw": imports,
                     "torch_free": torch_free == "yes"}
    for t in out.values():
        raw = t.pop("imports_raw")
        t["imports"] = set(out) if raw == "every tier" else {w.strip() for w in raw.split(",") if w.strip() in out}
    return out


TIERS = tiers(DOC.read_text())


def tier_of(module: str) -> str | None:
    for name, t in TIERS.items():
        for pattern in t["modules"]:
            if pattern.endswith("/*") and module.startswith(pattern[:-2].replace("/", ".") + "."):
                return name
            if module == pattern.replace("/", "."):
                return name
    return None


def _known(name: str) -> str | None:
    """`name` as a module id: itself, or a package's `__init__`."""
    return name if name in MODULES else (f"{name}.__init__" if f"{name}.__init__" in MODULES else None)


def imports(module: str) -> set[str]:
    """The package modules `module` imports, at the top or inside a function (relative or absolute)."""
    path = PKG / (module.replace(".", "/") + ".py")
    here = module.split(".")[:-1]  # the package the module sits in, relative to tutorial_lib
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        words = (node.module or "").split(".") if node.module else []
        if node.level:
            prefix = here[:len(here) - node.level + 1] + words
        elif words[:1] == ["tutorial_lib"]:
            prefix = words[1:]
        else:
            continue
        candidates = [".".join(prefix + [a.name]) for a in node.names] + ([".".join(prefix)] if prefix else [])
        found |= {k for k in map(_known, candidates) if k}
    found.discard(module)
    return found


def test_the_doc_names_the_tiers():
    assert {"face", "lessons", "loop", "base", "jobs", "tools", "doctor"} <= set(TIERS), TIERS


def test_every_module_has_a_tier():
    missing = [m for m in MODULES if tier_of(m) is None]
    assert not missing, f"add {missing} to a tier in the Tiers table of docs/architecture.md"


def test_the_tier_check_sees_relative_and_nested_imports():
    assert "engine" in imports("lessons.bench")  # from .. import data, distributed, engine
    assert "lessons.roofline" in imports("lessons.ladder")  # from . import roofline
    assert "lessons.size" in imports("notebook")  # from .lessons import size
    assert "config" in imports("engine")


@pytest.mark.parametrize("module", MODULES)
def test_imports_stay_in_the_allowed_tiers(module):
    own = tier_of(module)
    if own == "face":
        return
    bad = {m: tier_of(m) for m in imports(module) if tier_of(m) != own and tier_of(m) not in TIERS[own]["imports"]}
    assert not bad, (f"{module} ({own}) imports {bad}: the {own} tier imports only from "
                     f"{sorted(TIERS[own]['imports']) or 'nothing'} (docs/architecture.md); move the shared piece down")


def test_the_loop_never_imports_a_lesson():
    loop = [m for m in MODULES if tier_of(m) == "loop"]
    assert not {m: sorted(imports(m)) for m in loop if any(tier_of(i) == "lessons" for i in imports(m))}


def test_no_import_circle():
    graph = {m: imports(m) for m in MODULES if tier_of(m) != "face"}
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


def test_the_torch_free_tiers_do_not_import_torch():
    free = [m for m in MODULES if TIERS[tier_of(m)]["torch_free"]]
    assert "config" in free and "jobs" in free
    code = ("import sys, importlib\n"
            f"for m in {free!r}:\n"
            "    importlib.import_module('tutorial_lib.' + m)\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "one of the torch-free modules imports torch at import time"


def test_a_run_that_does_not_shard_never_imports_fsdp_or_dcp():
    """FSDP2 and torch.distributed.checkpoint take about a second to import: every rank, job and command that
    trains would pay it at its start. Only parallel=fsdp loads them (sharding.fsdp, sharding.dcp)."""
    code = ("import sys, tutorial_lib.engine as e, tutorial_lib.__main__\n"
            "print(sorted(m for m in sys.modules if m.startswith(('torch.distributed.checkpoint',"
            " 'torch.distributed.fsdp', 'torch.distributed._composable.fsdp'))))\n"
            "from tutorial_lib import sharding\n"
            "sharding.fsdp().fully_shard, sharding.dcp().async_save, sharding.dcp().state_dict.get_state_dict\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.stdout.splitlines()[:1] == ["[]"], f"importing the engine loads {out.stdout.strip()} {out.stderr}"
    assert out.returncode == 0, out.stderr  # and the sharded path finds what it needs


def test_docs_table_names_every_module():
    text = DOC.read_text()
    missing = [m for m in MODULES if not m.endswith("__init__") and f"`{m.replace('.', '/')}.py`" not in text]
    assert not missing, f"docs/architecture.md does not describe {missing}"


@pytest.mark.parametrize("module", MODULES)
def test_modules_and_functions_stay_readable(module):
    source = (PKG / (module.replace(".", "/") + ".py")).read_text()
    assert len(source.splitlines()) <= MAX_LINES, f"{module}.py is over {MAX_LINES} lines: split it by concern"
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            size = node.end_lineno - node.lineno + 1
            assert size <= MAX_FUNCTION, f"{module}.{node.name} is {size} lines: split it"


def test_a_lesson_s_short_name_is_no_other_module_s():
    """tl.bench, tl.ladder, ... reach tutorial_lib/lessons/ by their short names: one name, one module."""
    lessons = {m.split(".")[1] for m in MODULES if m.startswith("lessons.") and not m.endswith("__init__")}
    assert not lessons & {m for m in MODULES if "." not in m}


@pytest.mark.parametrize("script", sorted(p.name for p in GPU_SCRIPTS.iterdir()), ids=str)
def test_gpu_scripts_only_launch(script):
    """scripts/gpu/ holds launch lines: its measuring code lives in tutorial_lib/lessons/ as a study, where
    `make test` runs its small mode. No Python module, no heredoc of more than a few lines, no code string."""
    assert script.endswith(".sh"), f"scripts/gpu/{script}: Python belongs in tutorial_lib/lessons/ (a study)"
    text = (GPU_SCRIPTS / script).read_text()
    for heredoc in re.finditer(r"<<-?\s*'?(\w+)'?\n(.*?)\n\1\n", text, re.S):
        assert heredoc.group(2).count("\n") < 3, f"scripts/gpu/{script}: a heredoc of code; make it a study"
    assert not re.search(r"\s-c\s+['\"]|sys\.path", text), f"scripts/gpu/{script}: code in a string"
