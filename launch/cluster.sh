# Sourced by launch/run_recipe.sh (not run on its own). Two things live here:
#   source_cann_env   sources the Ascend CANN environment when it is installed and not yet sourced
#   run_multinode     NNODES > 1: validate, start or join Ray, wait for every node, preflight, train
# See docs/multinode.md. Needs REPO_ROOT and PYTHON from run_recipe.sh.
#
# What this launcher never does: kill a process it did not start, `pkill`, `ray stop --force`, or
# stop a Ray cluster that was already running. It runs `ray stop` at exit only when it started
# the Ray head or worker on this node itself (recorded in a run-specific temp dir).

_RR_PREFIX="[run_recipe]"

_say() { echo "${_RR_PREFIX} $*"; }

_die() {
    echo "${_RR_PREFIX} error: $*" >&2
    exit 1
}

# Source one set_env.sh: CANN's scripts read unset variables and may return non-zero, so they
# run without -e/-u.
_source_env_script() {
    set +eu
    # shellcheck disable=SC1090
    source "$1"
    set -eu
}

# CANN: when ASCEND_HOME_PATH is unset and <root>/ascend-toolkit/set_env.sh (older CANN) or
# <root>/cann/set_env.sh (newer CANN) exists, source it; then nnal/atb/set_env.sh when present and
# ATB_HOME_PATH is unset. <root> is $VERL_NPU_ASCEND_ROOT, default /usr/local/Ascend.
source_cann_env() {
    local root="${VERL_NPU_ASCEND_ROOT:-/usr/local/Ascend}"
    local script
    if [[ -z "${ASCEND_HOME_PATH:-}" ]]; then
        for script in "${root}/ascend-toolkit/set_env.sh" "${root}/cann/set_env.sh"; do
            if [[ -f "${script}" ]]; then
                _source_env_script "${script}"
                _say "sourced the CANN environment: ${script}"
                break
            fi
        done
    fi
    script="${root}/nnal/atb/set_env.sh"
    if [[ -z "${ATB_HOME_PATH:-}" && -n "${ASCEND_HOME_PATH:-}" && -f "${script}" ]]; then
        _source_env_script "${script}"
        _say "sourced the ATB (nnal) environment: ${script}"
    fi
}

# The `ray` command: $VERL_NPU_RAY, else `ray` on PATH, else the one beside $PYTHON (a venv that
# is not activated).
_find_ray() {
    if [[ -n "${VERL_NPU_RAY:-}" ]]; then
        RAY="${VERL_NPU_RAY}"
    elif command -v ray >/dev/null 2>&1; then
        RAY="ray"
    elif [[ -x "$(dirname "${PYTHON}")/ray" ]]; then
        RAY="$(dirname "${PYTHON}")/ray"
    else
        _die "the 'ray' command is not found; install ray in the Python environment (${PYTHON}) or set VERL_NPU_RAY"
    fi
}

# `ray status [--address ADDR]` answers (within 60 s). ADDR "auto" or empty: this node's cluster.
_ray_answers() {
    local address="${1:-auto}"
    local cmd=("${RAY}" status)
    [[ "${address}" != "auto" ]] && cmd+=(--address "${address}")
    if command -v timeout >/dev/null 2>&1; then
        timeout 60 "${cmd[@]}" >/dev/null 2>&1
    else
        "${cmd[@]}" >/dev/null 2>&1
    fi
}

# Sleep that lets INT/TERM traps run at once.
_nap() {
    sleep "$1" &
    wait $! || true
}

_require_int() {  # NAME VALUE MIN [MAX]
    local name="$1" value="$2" min="$3" max="${4:-}"
    local ok=1
    if ! [[ "${value}" =~ ^(0|[1-9][0-9]*)$ ]] || (( value < min )); then
        ok=0
    elif [[ -n "${max}" ]] && (( value > max )); then
        ok=0
    fi
    if (( ok == 0 )); then
        if [[ -n "${max}" ]]; then
            _die "${name}=${value} must be a whole number from ${min} to ${max}"
        fi
        _die "${name}=${value} must be a whole number >= ${min}"
    fi
}

_cleanup() {
    local rc=$?
    if [[ -n "${_RR_RUN_DIR:-}" && -f "${_RR_RUN_DIR}/started_ray" ]]; then
        _say "stopping the Ray $(cat "${_RR_RUN_DIR}/started_ray") this launcher started on this node: ${RAY} stop"
        "${RAY}" stop || _say "ray stop exited with status $?"
    fi
    if [[ -n "${_RR_RUN_DIR:-}" ]]; then
        rm -rf -- "${_RR_RUN_DIR}"
    fi
    exit "${rc}"
}

run_multinode() {
    NODE_RANK="${NODE_RANK:-0}"
    MASTER_PORT="${MASTER_PORT:-6379}"
    NODE_WAIT_TIMEOUT="${NODE_WAIT_TIMEOUT:-600}"
    NODE_POLL_INTERVAL="${NODE_POLL_INTERVAL:-10}"
    _require_int NNODES "${NNODES}" 1
    if ! [[ "${NODE_RANK}" =~ ^(0|[1-9][0-9]*)$ ]] || (( NODE_RANK >= NNODES )); then
        _die "NODE_RANK=${NODE_RANK} is out of range for NNODES=${NNODES}: use 0 on the head node and 1..$((NNODES - 1)) on the others"
    fi
    if [[ -z "${MASTER_ADDR:-}" ]]; then
        _die "NNODES=${NNODES} needs MASTER_ADDR: the address of node 0 (the Ray head) as the other nodes reach it, e.g. MASTER_ADDR=10.0.0.1"
    fi
    _require_int MASTER_PORT "${MASTER_PORT}" 1 65535
    _require_int NODE_WAIT_TIMEOUT "${NODE_WAIT_TIMEOUT}" 1
    if ! [[ "${NODE_POLL_INTERVAL}" =~ ^[0-9]+([.][0-9]+)?$ ]]; then
        _die "NODE_POLL_INTERVAL=${NODE_POLL_INTERVAL} must be a number of seconds"
    fi
    _RR_PREFIX="[run_recipe] node ${NODE_RANK}/${NNODES}:"
    _say "repo: ${REPO_ROOT}"
    _say "python: ${PYTHON}"

    _say "validating: ${PYTHON} -m verl_npu.cli validate $*"
    "${PYTHON}" -m verl_npu.cli validate "$@" || _die "the recipe is not valid (see above); nothing was started on this node"

    local args_text
    args_text="$("${PYTHON}" -m verl_npu.cluster ray-start-args --node-rank "${NODE_RANK}" "$@")" \
        || _die "could not read this node's devices (see above); nothing was started on this node"
    mapfile -t _RR_NODE_ARGS <<<"${args_text}"
    _find_ray

    _RR_RUN_DIR="$(mktemp -d "${TMPDIR:-/tmp}/verl_npu_launch.XXXXXX")"
    trap _cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM

    # A cluster already running on this node is used as it is and left running.
    local existing=""
    if [[ -n "${RAY_ADDRESS:-}" ]]; then
        existing="${RAY_ADDRESS}"
        _say "RAY_ADDRESS=${RAY_ADDRESS} is set: using that Ray cluster (this launcher will not start or stop Ray)"
    elif _ray_answers auto; then
        existing="auto"
        _say "a Ray cluster is already running on this node (ray status answers): using it (this launcher will not start or stop Ray)"
    fi

    if (( NODE_RANK == 0 )); then
        _run_head "${existing}" "$@"
    else
        _run_worker "${existing}"
    fi
}

_run_head() {
    local existing="$1"
    shift
    if [[ -n "${existing}" ]]; then
        export RAY_ADDRESS="${existing}"
    else
        local cmd=("${RAY}" start --head --port "${MASTER_PORT}" "${_RR_NODE_ARGS[@]}" --disable-usage-stats)
        [[ -n "${NODE_IP_ADDRESS:-}" ]] && cmd+=(--node-ip-address "${NODE_IP_ADDRESS}")
        _say "starting the Ray head: ${cmd[*]}"
        "${cmd[@]}" || _die "ray start --head failed (see above); is port ${MASTER_PORT} already in use? Set MASTER_PORT to a free port"
        echo "head" >"${_RR_RUN_DIR}/started_ray"
        export RAY_ADDRESS="${MASTER_ADDR}:${MASTER_PORT}"
    fi
    _say "waiting up to ${NODE_WAIT_TIMEOUT} s for ${NNODES} node(s) to join ${RAY_ADDRESS}"
    "${PYTHON}" -m verl_npu.cluster wait-for-nodes --address "${RAY_ADDRESS}" --nnodes "${NNODES}" \
        --timeout "${NODE_WAIT_TIMEOUT}" "$@" || _die "not every node joined (see above); nothing was trained"
    "${PYTHON}" -m verl_npu.cluster preflight --address "${RAY_ADDRESS}" --launched-nodes "${NNODES}" "$@" \
        || _die "the cluster does not fit the recipe (see above); nothing was trained"
    _say "training with RAY_ADDRESS=${RAY_ADDRESS}: ${PYTHON} -m verl_npu.cli run $*"
    local rc=0
    "${PYTHON}" -m verl_npu.cli run "$@" || rc=$?
    _say "training exited with status ${rc}"
    return "${rc}"
}

_run_worker() {
    local existing="$1"
    local head="${MASTER_ADDR}:${MASTER_PORT}"
    local watch="${head}"
    if [[ -n "${existing}" ]]; then
        watch="${existing}"
    else
        local cmd=("${RAY}" start --address "${head}" "${_RR_NODE_ARGS[@]}")
        [[ -n "${NODE_IP_ADDRESS:-}" ]] && cmd+=(--node-ip-address "${NODE_IP_ADDRESS}")
        local deadline=$((SECONDS + NODE_WAIT_TIMEOUT))
        _say "joining the Ray head: ${cmd[*]}"
        until "${cmd[@]}"; do
            if (( SECONDS >= deadline )); then
                _die "could not join the Ray head at ${head} within ${NODE_WAIT_TIMEOUT} s; check that node 0 runs the launcher with the same MASTER_ADDR/MASTER_PORT and that the port is reachable from here"
            fi
            _say "the head at ${head} is not reachable yet; retrying in ${NODE_POLL_INTERVAL} s"
            _nap "${NODE_POLL_INTERVAL}"
        done
        echo "worker" >"${_RR_RUN_DIR}/started_ray"
    fi
    _say "in the cluster; staying up until the head at ${watch} goes away (checked every ${NODE_POLL_INTERVAL} s)"
    local failures=0
    while (( failures < 2 )); do  # two misses in a row: one slow answer is not a dead head
        _nap "${NODE_POLL_INTERVAL}"
        if _ray_answers "${watch}"; then
            failures=0
        else
            failures=$((failures + 1))
        fi
    done
    _say "the head at ${watch} no longer answers; leaving"
    return 0
}
