"""The set-up files agree with each other: environment.yml, requirements.lock, pyproject.toml."""
import json
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"requirements.lock line {line!r} is not pinned with =="
            pins[norm(name)] = version
    return pins


def env_pins() -> tuple[str, dict[str, str]]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return python, {norm(p.split("==")[0]): p.split("==")[1] for p in pip}


def test_environment_yml_agrees_with_lock():
    lock = lock_pins()
    python, pins = env_pins()
    assert python == "python=3.11"
    for name, version in pins.items():
        assert name in lock, f"environment.yml pins {name} which requirements.lock lacks"
        assert lock[name] == version, f"{name}: environment.yml {version} != requirements.lock {lock[name]}"


def test_every_dependency_is_pinned_in_both():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = meta["dependencies"] + [d for extra in meta["optional-dependencies"].values() for d in extra]
    names = {norm(re.split(r"[<>=!~\[ ]", d)[0]) for d in deps}
    lock, (_, pins) = lock_pins(), env_pins()
    assert not names - set(lock), f"not in requirements.lock: {names - set(lock)}"
    assert not names - set(pins), f"not in environment.yml: {names - set(pins)}"


def test_torch_pair_is_the_tested_one():
    lock = lock_pins()
    assert (lock["torch"], lock["torchvision"]) == ("2.14.1", "0.29.1")
    assert tuple(int(x) for x in lock["tensorboard"].split(".")[:2]) >= (2, 21)


def test_makefile_has_the_readme_targets():
    text = (ROOT / "Makefile").read_text()
    for target in ("venv", "lab", "workbook", "test", "data", "slurm-up", "slurm-down"):
        assert re.search(rf"^{re.escape(target)}:", text, re.M), f"Makefile lacks target {target}"
    assert "--ip=127.0.0.1" in text and "bind_all" not in text
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_notebooks_open_in_the_kernel_make_kernel_registers():
    """A hub or `make lab` opens each notebook in the workbook's kernel, without asking which one."""
    from tutorial_lib import kernel

    recipe = re.search(r"^kernel:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert "-m tutorial_lib.kernel install" in recipe, recipe  # the kernel that registers NAME and DISPLAY
    name, display = kernel.NAME, kernel.DISPLAY
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        spec = json.loads(nb.read_text())["metadata"]["kernelspec"]
        assert spec == {"name": name, "display_name": display, "language": "python"}, f"{nb.name}: {spec}"
