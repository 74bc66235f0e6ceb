"""CPU binding in the rendered DDP jobs, on the local Slurm (scripts/slurm/local-cluster.sh): the lines a site
profile's cpu_bind, gpu_bind and numa_binding put into the templates (the `local` profile names all three) are
accepted by this Slurm and every rank runs; torchrun's NUMA binding is off on these nodes (no GPU, no numactl), and
the job's log says why instead of failing. The ranks run a small probe, not a training: what is tested is the
launch lines."""
from __future__ import annotations

import re
import subprocess

import pytest

from tutorial_lib import jobs, sites
from test_slurm import PROBLEM, finished

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(PROBLEM is not None, reason=str(PROBLEM))]

PROBE = """import os
print(f"probe rank={os.environ.get('RANK')} local={os.environ.get('LOCAL_RANK')} "
      f"gpus={os.environ.get('CUDA_VISIBLE_DEVICES')} cpus={len(os.sched_getaffinity(0))}", flush=True)
"""
LAYOUTS = {"srun": dict(mode="srun", nodes=2, gpus_per_node=2), "torchrun": dict(gpus_per_node=2),
           "multinode": dict(nodes=2, gpus_per_node=1)}


@pytest.fixture(scope="module")
def bound(tmp_path_factory):
    """One job per launch mode that starts a process per GPU, all submitted at once; name -> (text, Job)."""
    work = tmp_path_factory.mktemp("binding")
    probe = work / "probe.py"
    probe.write_text(PROBE)
    common = dict(site="local", jobs_dir=work / "jobs", show=False, output=f"{work}/%x-%j.out", time="00:05:00")
    submitted = {}
    for name, layout in LAYOUTS.items():
        path = jobs.write(f"t_bind_{name}", command=f"python {probe}", **common, **layout)
        submitted[name] = (path.read_text(), jobs.submit(path))
    yield submitted
    for _, job in submitted.values():
        subprocess.run(["scancel", job.id], capture_output=True)


def test_the_local_profile_asks_for_every_kind_of_binding():
    site = sites.load_site("local")
    assert (site.cpu_bind, site.gpu_bind, site.numa_binding) == ("cores", "closest", "node")


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_the_binding_lines_are_accepted_and_every_rank_runs(bound, name):
    text, job = bound[name]
    assert "--cpu-bind=cores" in text
    assert ("--gpu-bind=closest" in text) == (name == "srun")
    assert ("numa_binding=(" in text) == (name != "srun")
    assert finished(job, timeout=300) == "COMPLETED"
    log = job.log(400)
    world = LAYOUTS[name].get("nodes", 1) * LAYOUTS[name]["gpus_per_node"]
    ranks = sorted(int(r) for r in re.findall(r"probe rank=(\d+)", log))
    assert ranks == list(range(world)), log
    # this Slurm (TaskPlugin=task/none) takes --cpu-bind and binds nothing, saying so; a real site's binds
    assert "srun: cluster configuration lacks support for cpu binding" in log
    if name != "srun":  # torchrun's binding: off here, with the reason, and the job ran unbound
        assert re.search(r"CPU binding: off: (no numactl on this node|no GPU visible here)", log), log
    else:  # --gpu-bind=closest is taken too: under task/none every rank still sees its node's GPUs of the job
        gpus = re.findall(r"probe rank=\d+ local=\d gpus=(\S+)", log)
        assert len(gpus) == world and all(len(g.split(",")) == 2 for g in gpus), log
