"""The registered kernel (tutorial_lib/kernel.py, `make kernel`): it sets TENSORBOARD_PROXY_URL from the hub user's
prefix when it starts, so that `%tensorboard` from any notebook in it goes through the server's proxy."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from tutorial_lib import kernel


def test_the_proxy_address_comes_from_the_hub_users_prefix(monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/ada/")
    monkeypatch.delenv("TENSORBOARD_PROXY_URL", raising=False)
    monkeypatch.setenv("PATH", "/usr/bin")
    add = kernel.kernel_env()
    assert add["TENSORBOARD_PROXY_URL"] == "/user/ada/proxy/%PORT%/"
    assert add["PATH"] == f"{Path(sys.executable).parent}{os.pathsep}/usr/bin"
    monkeypatch.setenv("TENSORBOARD_PROXY_URL", "/mine/%PORT%/")  # a value the user set is kept
    assert "TENSORBOARD_PROXY_URL" not in kernel.kernel_env()
    monkeypatch.delenv("JUPYTERHUB_SERVICE_PREFIX")
    monkeypatch.delenv("TENSORBOARD_PROXY_URL")
    assert "TENSORBOARD_PROXY_URL" not in kernel.kernel_env()  # no hub: notebook.setup asks the local server


@pytest.fixture
def jupyter_data(tmp_path, monkeypatch):
    """A Jupyter data folder of its own, where `install --user` writes the kernel spec."""
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    return tmp_path / "jupyter"


def test_install_writes_a_spec_that_starts_this_module_with_the_env_given(jupyter_data, capsys):
    assert kernel.main(["install", "--env", "PYTHONPATH", str(ROOT)]) == 0
    spec = json.loads((jupyter_data / "kernels" / kernel.NAME / "kernel.json").read_text())
    assert spec["argv"][0] == sys.executable and spec["argv"][-4:] == ["-m", "tutorial_lib.kernel", "-f",
                                                                       "{connection_file}"]
    assert spec["display_name"] == kernel.DISPLAY and spec["env"] == {"PYTHONPATH": str(ROOT)}
    assert "sets TENSORBOARD_PROXY_URL on JupyterHub" in capsys.readouterr().out
    assert kernel.main(["install", "--env", "PYTHONPATH"]) == 2  # a name without its value
    assert "not understood: --env PYTHONPATH" in capsys.readouterr().err


def test_install_is_refused_when_the_kernel_could_not_import_the_workbook(jupyter_data, monkeypatch, capsys):
    monkeypatch.setattr(kernel.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "no module"))
    assert kernel.main(["install"]) == 1
    assert "--env PYTHONPATH \"$PWD\"" in capsys.readouterr().err
    assert not (jupyter_data / "kernels").exists()  # nothing registered


def test_a_kernel_started_on_a_hub_has_the_proxy_address(jupyter_data, monkeypatch):
    """The installed spec, started by jupyter_client as a Jupyter server starts it, for the hub user ada."""
    from jupyter_client.manager import start_new_kernel

    assert kernel.main(["install"]) == 0
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/ada/")
    monkeypatch.delenv("TENSORBOARD_PROXY_URL", raising=False)
    manager, client = start_new_kernel(kernel_name=kernel.NAME, startup_timeout=120)
    try:
        said = []
        client.execute_interactive("import os; print(os.environ['TENSORBOARD_PROXY_URL'])", timeout=60,
                                   output_hook=lambda m: said.append(m["content"].get("text", "")))
        assert "".join(said).strip() == "/user/ada/proxy/%PORT%/"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_make_kernel_and_the_readme_register_this_kernel():
    recipe = (ROOT / "Makefile").read_text().split("\nkernel:", 1)[1].split("\n\n", 1)[0]
    assert "$(BIN)/python -m tutorial_lib.kernel install" in recipe and "ipykernel install" not in recipe
    readme = (ROOT / "README.md").read_text()
    assert "<env>/bin/python -m tutorial_lib.kernel install --env PYTHONPATH $PWD" in readme
