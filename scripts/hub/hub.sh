#!/bin/bash
# hub.sh - the workbook's local JupyterHub: each learner's server is a Slurm job on the local cluster.
#
# Usage (as root):
#     bash scripts/hub/hub.sh up        # prepare what is missing, start the hub, print its URL and the accounts
#     bash scripts/hub/hub.sh down      # stop the hub; it cancels its servers' jobs (and no other job)
#     bash scripts/hub/hub.sh status    # the hub, its URL, its servers' jobs
#     bash scripts/hub/hub.sh prepare   # everything `up` prepares, without starting the hub
# or `make hub` / `make hub-down`.
#
# What `prepare` does, each step skipped when it is done already:
#   - the local Slurm cluster: scripts/slurm/local-cluster.sh up (shared with the other tests; never stopped here)
#   - configurable-http-proxy from npm, at the versions of scripts/hub/package-lock.json, into $SHARED/proxy
#   - the learners' environment $SHARED/env: the packages of requirements.lock (JupyterLab, jupyter-server-proxy,
#     torch, the hub's own packages), readable by everyone and writable by nobody but root, without the
#     workbook's package: each learner's kernel imports it from their own clone. When this checkout's .venv
#     matches the lock and lies on the same file system, its packages are hard-linked (seconds, no extra disk);
#     otherwise pip installs the lock.
#   - the handout: this checkout (its tracked files, uncommitted changes included) as branch main of the
#     repository $SHARED/handout.git, which is what learners clone. Learners never read this checkout (nor does
#     any process of theirs start in it): it may lie in a folder only root may enter (/root, a mktemp -d).
#   - the learners (alice and bob): a Unix account with a password, the handout cloned into ~/hpc-workbook
#     with nbgitpuller (the tool instructors hand a workbook out with), and the workbook's kernel registered
#     for that clone
# Once prepared, nothing is downloaded: the hub, its proxy and the servers run from these copies.
#
# Settings (environment; the test's hub uses its own name, port and a short idle limit):
#   WORKBOOK_HUB_NAME (workbook)   names the state folder and the servers' jobs (<name>-server-<learner>)
#   WORKBOOK_HUB_PORT (8000)       the hub's address is http://127.0.0.1:PORT/; PORT+1 and PORT+2 are its API
#                                  and its proxy's API
#   WORKBOOK_HUB_STATE             the hub's database, log and PID files (/tmp/workbook-hub/<name>)
#   WORKBOOK_HUB_HOME              the shared environment, proxy, handout and passwords (/opt/hpc-workbook)
#   WORKBOOK_HUB_IDLE (3600)       seconds without activity before the hub stops a server
#   WORKBOOK_HUB_LEARNERS          the accounts ("alice bob")
#   WORKBOOK_HUB_STOP_WAIT (60)    seconds `down` waits, beyond Slurm's KillWait, for its servers' jobs to end
#   more in scripts/hub/jupyterhub_config.py (limits per server, queue wait, poll interval)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/scripts/hub
# Every process started from here begins in /, not in the caller's folder: a learner's (git, nbgitpuller,
# ipykernel) would stop at a working folder it may not enter, such as a checkout in a private folder.
cd /
export WORKBOOK_HUB_NAME=${WORKBOOK_HUB_NAME:-workbook}
export WORKBOOK_HUB_PORT=${WORKBOOK_HUB_PORT:-8000}
export WORKBOOK_HUB_STATE=${WORKBOOK_HUB_STATE:-/tmp/workbook-hub/$WORKBOOK_HUB_NAME}
export WORKBOOK_HUB_HOME=${WORKBOOK_HUB_HOME:-/opt/hpc-workbook}
export WORKBOOK_HUB_LEARNERS=${WORKBOOK_HUB_LEARNERS:-alice bob}
NAME=$WORKBOOK_HUB_NAME
PORT=$WORKBOOK_HUB_PORT
STATE=$WORKBOOK_HUB_STATE
SHARED=$WORKBOOK_HUB_HOME
ENV=$SHARED/env
PROXY=$SHARED/proxy
HANDOUT=$SHARED/handout.git
ACCOUNTS=$SHARED/accounts
read -r -a LEARNERS <<<"$WORKBOOK_HUB_LEARNERS"
CLONE=hpc-workbook  # the folder of each learner's clone, in their home
URL=http://127.0.0.1:$PORT

log() { echo "hub: $*"; }
die() { echo "hub: error: $*" >&2; exit 1; }

need_root() {
    [[ $(id -u) -eq 0 ]] || die "run as root: the hub creates the learners' accounts, authenticates them with \
PAM and submits their servers' jobs as them (make hub, as root)"
}

# ---------------------------------------------------------------------------------------- the proxy
install_proxy() {
    local want have=""
    want=$(sed -n 's/.*"configurable-http-proxy": "\([0-9.]*\)".*/\1/p' "$HERE/package.json")
    [[ -x $PROXY/node_modules/.bin/configurable-http-proxy ]] &&
        have=$(node "$PROXY/node_modules/.bin/configurable-http-proxy" --version 2>/dev/null || true)
    if [[ $have == "$want" ]] && cmp -s "$HERE/package-lock.json" "$PROXY/package-lock.json"; then return 0; fi
    command -v npm >/dev/null || die "configurable-http-proxy needs node and npm (node >= 20): install them \
(Debian: apt-get install nodejs npm), then run this again"
    log "installing configurable-http-proxy $want from npm (scripts/hub/package-lock.json) into $PROXY"
    mkdir -p "$PROXY"
    cp "$HERE/package.json" "$HERE/package-lock.json" "$PROXY/"
    (cd "$PROXY" && npm ci --omit=dev --no-audit --no-fund --loglevel=error >"$PROXY/npm.log" 2>&1) ||
        die "npm ci failed in $PROXY; its log: $PROXY/npm.log"
    chmod -R a+rX "$PROXY"
}

# ---------------------------------------------------------------------------------------- the learners' environment
# shared_python: a Python >= 3.10 that every learner may run (this checkout's may live in root's home), outside
# this checkout (a venv made with --copies holds its own: learners would run a file of the checkout).
shared_python() {
    local candidate
    for candidate in ${WORKBOOK_HUB_PYTHON:-} "$(readlink -f "$ROOT/.venv/bin/python" 2>/dev/null)" \
        /usr/bin/python3 /usr/local/bin/python3; do
        [[ -n $candidate && -x $candidate ]] || continue
        [[ $(readlink -f "$candidate") == "$ROOT"/* ]] && continue
        if runuser -u nobody -- "$candidate" -c 'import sys, venv; sys.exit(sys.version_info < (3, 10))' \
            >/dev/null 2>&1; then
            echo "$candidate"
            return 0
        fi
    done
    die "no Python >= 3.10 that every user may run (this checkout's is not readable by others): install \
python3 system-wide (Debian: apt-get install python3 python3-venv) or set WORKBOOK_HUB_PYTHON"
}

py_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }

# venv_matches: this checkout's .venv has the lock installed, the same Python version, on the same file system
venv_matches() {
    local venv=$ROOT/.venv python=$1
    [[ -f $venv/.installed && $venv/.installed -nt $ROOT/requirements.lock && -x $venv/bin/python ]] || return 1
    [[ $(py_version "$venv/bin/python") == "$(py_version "$python")" ]] || return 1
    mkdir -p "$SHARED"
    [[ $(stat -c %d "$venv") == $(stat -c %d "$SHARED") ]]
}

link_packages() {
    # Hard links of the checkout's packages (a file changed by pip is replaced, never written in place, so
    # neither copy can change the other). Not the workbook's own package: learners import their clone's.
    local venv=$ROOT/.venv site f
    site=lib/python$(py_version "$1")/site-packages
    cp -al "$venv/$site/." "$ENV/$site/"
    rm -rf "$ENV/$site"/__editable__*tutorial_lib* "$ENV/$site"/tutorial_lib-*.dist-info
    for f in share etc; do [[ -d $venv/$f ]] && cp -al "$venv/$f" "$ENV/"; done
    for f in "$venv"/bin/*; do
        case $(basename "$f") in python* | activate* | workbook) continue ;; esac
        [[ -e $ENV/bin/$(basename "$f") ]] && continue
        # pip's launchers name their Python: on the first line (#!), or on the second one (a /bin/sh
        # trampoline, for a long path): the copy names the shared environment's, never the checkout's
        if [[ $(head -c 2 "$f") == "#!" ]] && head -n 2 "$f" | grep -qF "$venv/bin/"; then
            { head -n 2 "$f" | sed "s#$venv/bin/#$ENV/bin/#g"; tail -n +3 "$f"; } >"$ENV/bin/$(basename "$f")"
            chmod 755 "$ENV/bin/$(basename "$f")"
        else
            cp -a "$f" "$ENV/bin/"
        fi
    done
}

build_env() {
    local python want
    python=$(shared_python)
    want="$(sha256sum <"$ROOT/requirements.lock" | cut -c1-16) python $(py_version "$python")"
    [[ -f $ENV/.workbook-env && $(cat "$ENV/.workbook-env") == "$want" ]] && return 0
    hub_running && die "the hub runs from $ENV, which must be rebuilt for requirements.lock: make hub-down first"
    rm -rf "$ENV"
    if venv_matches "$python"; then
        log "building the learners' environment $ENV from this checkout's .venv (hard links), on $python \
($("$python" -V 2>&1))"
        "$python" -m venv --without-pip "$ENV"
        link_packages "$python"
    else
        log "building the learners' environment $ENV: pip install -r requirements.lock on $python \
($("$python" -V 2>&1); a few minutes)"
        "$python" -m venv "$ENV"
        "$ENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$ROOT/requirements.lock" ||
            die "pip install -r requirements.lock into $ENV failed (see above; a package that needs a newer \
Python than $("$python" -V 2>&1): point WORKBOOK_HUB_PYTHON at a newer one that every user may run)"
    fi
    # A centre's settings for everyone's JupyterLab: no news or update checks (compute nodes are offline).
    mkdir -p "$ENV/share/jupyter/lab/settings"
    cat >"$ENV/share/jupyter/lab/settings/overrides.json" <<'EOF'
{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}
EOF
    "$ENV/bin/python" -c 'import jupyterhub, batchspawner, jupyter_server_proxy, nbgitpuller, torch' ||
        die "$ENV is incomplete (an import failed above); remove it and run this again"
    echo "$want" >"$ENV/.workbook-env"
    chmod -R a+rX,go-w "$ENV"
}

# ---------------------------------------------------------------------------------------- handout and learners
publish_handout() {
    # One commit per change on top of the previous handout, as an instructor's updates are (learners' clones
    # are shallow: nbgitpuller merges each update into them)
    local tree head parent="" commit dirty="" stash
    head=$(git -C "$ROOT" rev-parse --short=12 HEAD)
    stash=$(git -C "$ROOT" stash create 2>/dev/null || true)
    if [[ -n $stash ]]; then tree=$(git -C "$ROOT" rev-parse "$stash^{tree}"); dirty=" + uncommitted changes"; else
        tree=$(git -C "$ROOT" rev-parse "HEAD^{tree}"); fi
    [[ -d $HANDOUT ]] || git init -q --bare "$HANDOUT"
    git -C "$HANDOUT" symbolic-ref HEAD refs/heads/main
    if git -C "$HANDOUT" rev-parse -q --verify refs/heads/main >/dev/null; then
        git -C "$ROOT" fetch -q "$HANDOUT" main
        parent=$(git -C "$ROOT" rev-parse FETCH_HEAD)
        if [[ $(git -C "$ROOT" rev-parse "$parent^{tree}") == "$tree" ]]; then
            log "handout: $HANDOUT, branch main is up to date (${parent:0:12})"
            return 0
        fi
    fi
    commit=$(git -C "$ROOT" -c user.name=instructor -c user.email=instructor@localhost \
        commit-tree "$tree" ${parent:+-p "$parent"} -m "The workbook at $head$dirty")
    git -C "$ROOT" push -q "$HANDOUT" "$commit:refs/heads/main"
    chmod -R a+rX "$HANDOUT"
    log "handout: $HANDOUT, branch main = ${commit:0:12} (the workbook at $head$dirty)"
}

# as_learner: a command as the learner, in their home (never in this checkout, which may be private)
as_learner() { local u=$1 home=$2; shift 2; (cd "$home" && runuser -u "$u" -- env HOME="$home" "$@"); }

password_of() { if [[ -f $ACCOUNTS ]]; then awk -v u="$1" '$1 == u { print $2 }' "$ACCOUNTS"; fi; }

setup_learner() {
    local u=$1 home password
    if ! id -u "$u" >/dev/null 2>&1; then
        useradd --create-home --shell /bin/bash "$u"
        log "created the account $u"
    fi
    home=$(getent passwd "$u" | cut -d: -f6)
    chmod 700 "$home"  # a learner's files (notebooks, runs, TensorBoard logs) are theirs alone on a shared node
    password=$(password_of "$u")
    if [[ -z $password ]]; then
        password=$(head -c 12 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 12)
        (umask 077 && echo "$u $password" >>"$ACCOUNTS")
    fi
    echo "$u:$password" | chpasswd
    # git refuses a repository another user owns unless it is named safe (the handout belongs to root)
    as_learner "$u" "$home" git config --global --get-all safe.directory 2>/dev/null | grep -qxF "$HANDOUT" ||
        as_learner "$u" "$home" git config --global --add safe.directory "$HANDOUT"
    # nbgitpuller: a clone the first time, later a merge that keeps the learner's own changes
    as_learner "$u" "$home" "$ENV/bin/gitpuller" "file://$HANDOUT" main "$home/$CLONE" >"$STATE/gitpuller-$u.log" 2>&1 ||
        die "nbgitpuller could not update $home/$CLONE for $u; its log: $STATE/gitpuller-$u.log"
    # the workbook's kernel for this clone: the shared Python, the package of the learner's own clone; it sets
    # TENSORBOARD_PROXY_URL from the learner's hub prefix when it starts (tutorial_lib/kernel.py)
    as_learner "$u" "$home" env PYTHONPATH="$home/$CLONE" "$ENV/bin/python" -m tutorial_lib.kernel install \
        --env PYTHONPATH "$home/$CLONE" >/dev/null
}

# ---------------------------------------------------------------------------------------- the hub
# hub_running: the PID file names a live jupyterhub
hub_running() {
    local pid
    pid=$(cat "$STATE/jupyterhub.pid" 2>/dev/null) && [[ -n $pid ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q jupyterhub
}

healthy() { curl -sf --max-time 3 "$URL/hub/health" >/dev/null; }

prepare() {
    need_root
    log "learners get the workbook from $HANDOUT and run $ENV: none reads this checkout, whose folders may \
be private (needs: root, a Python >= 3.10 every user may run, node and npm)"
    mkdir -p "$STATE" "$SHARED"
    chmod 700 "$STATE"
    bash "$ROOT/scripts/slurm/local-cluster.sh" up
    install_proxy
    build_env
    publish_handout
    local u
    for u in "${LEARNERS[@]}"; do setup_learner "$u"; done
}

start_hub() {
    if hub_running && healthy; then
        log "already running"
        return 0
    fi
    local other
    for other in "$PORT" $((PORT + 1)) $((PORT + 2)); do
        if (echo >"/dev/tcp/127.0.0.1/$other") 2>/dev/null; then
            die "port $other on 127.0.0.1 is taken: stop what listens there, or choose WORKBOOK_HUB_PORT"
        fi
    done
    log "starting JupyterHub on $URL (log: $STATE/jupyterhub.log)"
    (
        # a daemon of its own session, holding none of the caller's files (a pipe left open would keep the
        # caller, e.g. `make hub | tee`, waiting for the hub to end)
        for fd in "/proc/$BASHPID/fd/"*; do
            fd=${fd##*/}
            ((fd > 2)) && eval "exec $fd>&-"
        done
        cd "$STATE" && PATH="$ENV/bin:$PATH" exec setsid "$ENV/bin/jupyterhub" -f "$HERE/jupyterhub_config.py" \
            >>"$STATE/jupyterhub.log" 2>&1 </dev/null
    ) &
    local deadline=$((SECONDS + 90))
    until healthy; do
        ((SECONDS < deadline)) || { tail -20 "$STATE/jupyterhub.log" >&2; die "the hub did not answer at $URL within 90 s (its log ends above)"; }
        sleep 1
    done
}

show() {
    local u
    echo
    echo "JupyterHub: $URL/  (127.0.0.1 only; from your own computer: ssh -L $PORT:127.0.0.1:$PORT <this machine>)"
    echo "Each learner's server is a Slurm job ($NAME-server-<learner>; squeue shows them). Accounts:"
    for u in "${LEARNERS[@]}"; do echo "    $u / $(password_of "$u")"; done
    echo "Hand the workbook out with this link (nbgitpuller updates each learner's clone, then opens notebook 00):"
    echo "    $URL/hub/user-redirect/git-pull?repo=file://$HANDOUT&branch=main&urlpath=lab/tree/$CLONE/notebooks/00_setup.ipynb"
    echo "Stop it with: make hub-down"
}

hub_jobs() {
    local u
    for u in "${LEARNERS[@]}"; do
        squeue -h -u "$u" -n "$NAME-server-$u" -o %i 2>/dev/null || true
    done
}

cmd_down() {
    need_root
    [[ ${WORKBOOK_HUB_STOP_WAIT:-60} =~ ^[0-9]+$ ]] || die "WORKBOOK_HUB_STOP_WAIT=$WORKBOOK_HUB_STOP_WAIT is not \
a whole number of seconds: give one, such as 60"
    local pid jobs
    if hub_running; then
        pid=$(cat "$STATE/jupyterhub.pid")
        log "stopping the hub (PID $pid); it stops its servers"
        # its idle-culler service first: the hub would give it 30 s to answer SIGINT, which it may not
        local culler
        for culler in $(pgrep -P "$pid" -f jupyterhub_idle_culler || true); do kill -TERM "$culler"; done
        kill -TERM "$pid"
        local deadline=$((SECONDS + 90))
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.5; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    rm -f "$STATE/jupyterhub.pid"
    pid=$(cat "$STATE/proxy.pid" 2>/dev/null || true)
    if [[ -n $pid ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q configurable-http-proxy; then
        kill -TERM "$pid"
    fi
    rm -f "$STATE/proxy.pid"
    jobs=$(hub_jobs | tr '\n' ' ')
    if [[ -n ${jobs// /} ]]; then
        log "cancelling the servers' jobs still queued or running: $jobs"
        # shellcheck disable=SC2086  # one argument per job id
        scancel $jobs
    fi
    wait_for_jobs_to_end
    log "down"
}

# A cancelled job stays in the queue as COMPLETING until its processes have exited: Slurm sends SIGTERM, then
# SIGKILL KillWait seconds later. `down` returns once its servers' jobs have left, so their nodes are free.
wait_for_jobs_to_end() {
    local kill_wait left limit
    kill_wait=$(scontrol show config 2>/dev/null | sed -n 's/^KillWait *= *\([0-9]*\) sec.*/\1/p')
    limit=$((${kill_wait:-30} + ${WORKBOOK_HUB_STOP_WAIT:-60}))
    left=$(hub_jobs | xargs)
    [[ -n $left ]] || return 0
    log "waiting for the servers' jobs to end: $left (Slurm kills what still runs after KillWait=${kill_wait:-?} s)"
    local deadline=$((SECONDS + limit))
    while [[ -n $left ]] && ((SECONDS < deadline)); do
        sleep 1
        left=$(hub_jobs | xargs)
    done
    [[ -z $left ]] || echo "hub: warning: the servers' jobs $left have not ended after $limit s: see \
squeue -j ${left// /,}; an administrator may need to end their processes on the node" >&2
}

cmd_status() {
    if hub_running && healthy; then echo "hub: running at $URL/ (PID $(cat "$STATE/jupyterhub.pid"))"; else
        echo "hub: not running ($NAME)"; fi
    local u
    for u in "${LEARNERS[@]}"; do squeue -h -u "$u" -n "$NAME-server-$u" -o "server job %i of %u: %T on %N" 2>/dev/null || true; done
}

case ${1:-} in
    up) prepare && start_hub && show ;;
    prepare) prepare ;;
    down) cmd_down ;;
    status) cmd_status ;;
    *) echo "usage: bash $0 up|down|status|prepare" >&2; exit 2 ;;
esac
