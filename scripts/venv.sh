# shellcheck shell=bash
# The repository's .venv for scripts/test and scripts/bench (sourced, not run).
#
# ensure_venv: create "$ROOT/.venv" if missing (with ${LGC_PYTHON:-python3}), install
# '.[dev]' into it when pyproject.toml changed since the last install, and put it
# first on PATH. Sets VENV and VPY. The caller defines ROOT, say() and die().
ensure_venv() {
    VENV="$ROOT/.venv"
    VPY="$VENV/bin/python"
    STAMP="$VENV/.lgc-pyproject.sha256"

    if [ -x "$VPY" ] && ! "$VPY" -c 'import sys' >/dev/null 2>&1; then
        say ".venv is broken, recreating it"
        rm -rf "$VENV"
    fi
    if [ ! -x "$VPY" ]; then
        say "creating .venv with ${LGC_PYTHON:-python3}"
        "${LGC_PYTHON:-python3}" -m venv "$VENV" \
            || die "could not create .venv (is the python3 venv module installed?)"
    fi

    WANT_HASH="$(sha256sum pyproject.toml | cut -d' ' -f1)"
    if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$WANT_HASH" ]; then
        say "installing '.[dev]' into .venv (pyproject.toml changed or first run)"
        t0=$(date +%s)
        "$VPY" -m pip install --quiet --disable-pip-version-check -e '.[dev]' \
            || die "pip install -e '.[dev]' failed"
        printf '%s\n' "$WANT_HASH" > "$STAMP"
        say "installed in $(( $(date +%s) - t0 ))s"
    else
        say ".venv is up to date with pyproject.toml"
    fi

    export VIRTUAL_ENV="$VENV"
    export PATH="$VENV/bin:$PATH"
}
