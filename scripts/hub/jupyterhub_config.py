# The workbook's local JupyterHub: each learner's server is a Slurm job (batchspawner's SlurmSpawner).
#
# Started by scripts/hub/hub.sh (`make hub`, as root), which prepares what this file names: the local Slurm
# cluster, configurable-http-proxy (npm, pinned), the learners' shared environment, their accounts and their
# clones of the workbook. It is also the worked example of docs/instructor.md ("For a centre's admins"):
# every setting the workbook relies on is here, with why. A real centre changes the marked lines (ip, the
# authenticator, the environment's prologue, the limits) and keeps the rest.
#
# Settings that change between this hub and the test's hub come from WORKBOOK_HUB_* variables (hub.sh sets
# them); every default is what `make hub` uses.
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # workbook_spawner.py beside this file

c = get_config()  # noqa: F821 (JupyterHub defines it)


def setting(name: str, default: str) -> str:
    return os.environ.get(f"WORKBOOK_HUB_{name}", default)


NAME = setting("NAME", "workbook")  # names the state folder and the servers' jobs
STATE = Path(setting("STATE", f"/tmp/workbook-hub/{NAME}"))
PORT = int(setting("PORT", "8000"))
SHARED = Path(setting("HOME", "/opt/hpc-workbook"))
ENV = SHARED / "env"  # the learners' environment: one read-only copy for everyone, like a centre's module
IDLE = int(setting("IDLE", "3600"))  # seconds without activity before the hub stops a server
LEARNERS = setting("LEARNERS", "alice bob").split()

# ---- where: the hub, its proxy and the servers listen on 127.0.0.1 only ---------------------------------------
# (a centre: the public URL behind its TLS front end; hub_bind_url on the interface the compute nodes reach)
c.JupyterHub.bind_url = f"http://127.0.0.1:{PORT}"
c.JupyterHub.public_url = f"http://127.0.0.1:{PORT}/"  # servers see it ($JUPYTERHUB_PUBLIC_URL): doctor checks links
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{PORT + 1}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{PORT + 2}"
c.ConfigurableHTTPProxy.command = [str(SHARED / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = str(STATE / "proxy.pid")
c.JupyterHub.pid_file = str(STATE / "jupyterhub.pid")
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.JupyterHub.cleanup_servers = True  # stopping the hub stops the servers: their jobs are cancelled
c.JupyterHub.template_paths = [str(HERE / "templates")]  # pages that say how a server's job ended

# ---- who: the learners' own Unix accounts (PAM), nobody else ----------------------------------------------------
# (a centre: its PAM, LDAP or OAuth authenticator; the servers run as the learner's uid either way)
c.JupyterHub.authenticator_class = "pam"
c.Authenticator.allowed_users = set(LEARNERS)
c.JupyterHub.shutdown_on_logout = True  # logging out ends the server's job: its node is free for others

# ---- the spawner: each server is a Slurm job, submitted as the learner ------------------------------------------
c.JupyterHub.spawner_class = "workbook_spawner.WorkbookSlurmSpawner"
c.WorkbookSlurmSpawner.hub_name = NAME
# Limits per server: the time of a workshop day, the CPUs a DataLoader lesson needs, memory, one GPU (the
# local cluster's GPUs are stand-ins: the notebooks see none and run with small sizes).
c.WorkbookSlurmSpawner.req_partition = setting("PARTITION", "debug")
c.WorkbookSlurmSpawner.req_runtime = setting("SERVER_TIME", "08:00:00")
c.WorkbookSlurmSpawner.req_nprocs = setting("SERVER_CPUS", "2")
c.WorkbookSlurmSpawner.req_memory = setting("SERVER_MEMORY", "8G")
c.WorkbookSlurmSpawner.req_gres = setting("SERVER_GRES", "gpu:1")
# The environment of the server and of its kernels: what a centre's `module load` does. Every learner uses the
# same read-only copy; the workbook's package comes from each learner's own clone (the kernel's PYTHONPATH,
# registered by hub.sh), so runs/ and jobs/ are the learner's.
c.WorkbookSlurmSpawner.req_prologue = f'export PATH="{ENV}/bin:$PATH"'
c.Spawner.cmd = [str(ENV / "bin" / "jupyterhub-singleuser")]
c.WorkbookSlurmSpawner.batchspawner_singleuser_cmd = str(ENV / "bin" / "batchspawner-singleuser")
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.Spawner.start_timeout = 300  # the job may queue; the spawner gives up (with a message) after queue_wait
c.WorkbookSlurmSpawner.queue_wait = int(setting("QUEUE_WAIT", "240"))
c.Spawner.http_timeout = 90
c.Spawner.poll_interval = int(setting("POLL", "30"))  # how soon the hub notices a server's job has ended
c.Spawner.environment = {
    # the server tells the hub it is in use this often: the idle limit below counts from the last report
    "JUPYTERHUB_ACTIVITY_INTERVAL": str(min(300, max(10, IDLE // 4))),
}

# ---- idle servers: stopped after IDLE seconds without activity (a tab left open keeps its server) -----------
c.WorkbookSlurmSpawner.idle_limit = IDLE
c.JupyterHub.last_activity_interval = min(300, max(10, IDLE // 4))
c.JupyterHub.services = [{
    "name": "idle-culler",
    "command": [sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={IDLE}",
                f"--cull-every={min(600, max(10, IDLE // 6))}"],
}]
c.JupyterHub.load_roles = [{
    "name": "idle-culler",
    "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
    "services": ["idle-culler"],
}]
