#!/usr/bin/env bash
# One command: a CPU-only virtual environment that imports SGLang's output path (no GPU kernels).
#
#   tools/sglang_ref/setup_venv.sh [SGLANG_VERSION] [VENV_DIR]
#
# Defaults: 0.5.23 in ${FASTACCUM_SGLANG_VENV:-$HOME/.cache/fastaccum/sglang-<version>}. Prints the
# venv's python on the last line: export it as FASTACCUM_SGLANG_PYTHON for the live test tier.
#
# Why this shape: SGLang's wheel pins a CUDA torch and GPU kernels that cannot install or load here,
# so torch is the local CPU wheel (pinned by a constraints file so pip never swaps it), SGLang goes
# in with --no-deps, and only the modules imported on the way to tokenizer_manager / http_server
# follow, at the versions the wheel's own metadata pins. PyPI's torchvision does not load next to
# this torch, and nothing on the output path uses it: a small import stub stands in for it.
set -euo pipefail

VERSION="${1:-0.5.23}"
VENV="${2:-${FASTACCUM_SGLANG_VENV:-$HOME/.cache/fastaccum/sglang-$VERSION}}"
TORCH="${FASTACCUM_SGLANG_TORCH:-torch==2.13.0}"
HERE="$(cd "$(dirname "$0")" && pwd)"

case "$VENV" in
  "$(cd "$HERE/../.." && pwd)"/*) echo "refusing to create the venv inside the repository: $VENV" >&2; exit 2 ;;
esac

# Modules SGLang imports on the way to the tokenizer manager and the HTTP server (import names
# differ from some of these distribution names). Pins come from the wheel's metadata when it has one.
IMPORT_DEPS=(
  numpy orjson fastapi uvicorn uvloop pydantic pybase64 pyzmq psutil requests aiohttp
  transformers packaging setproctitle msgspec prometheus-client python-multipart tqdm regex
  pillow einops xxhash ipython dill apache-tvm-ffi sentencepiece compressed-tensors gguf openai
  partial_json_parser jsonschema xgrammar soundfile httpx
)
# triton is a hard import that the CPU torch wheel does not bring.
EXTRA_DEPS=("triton==3.8.0")

start=$(date +%s)
python3.11 -m venv "$VENV"
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check)
constraints="$VENV/fastaccum-constraints.txt"
printf '%s\n' "$TORCH" > "$constraints"

quiet() { grep -v "is ignored: it is neither\|requires \|dependency resolver\|incompatible" || true; }
"${PIP[@]}" -c "$constraints" "$TORCH" 2>&1 | quiet
"${PIP[@]}" --no-deps "sglang==$VERSION" 2>&1 | quiet

# Resolve each import dependency to the wheel's own pin (e.g. transformers==5.19.0 for 0.5.23).
mapfile -t specs < <("$VENV/bin/python" - "${IMPORT_DEPS[@]}" <<'EOF'
import re
import sys
from importlib.metadata import requires

norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
pins = {}
for req in requires("sglang") or []:
    if "extra ==" in req:
        continue
    spec = req.split(";")[0].strip()
    name = re.match(r"[A-Za-z0-9_.\-]+", spec).group(0)
    pins[norm(name)] = re.sub(r"\[[^\]]*\]", "", spec).replace(" ", "")
for name in sys.argv[1:]:
    print(pins.get(norm(name), name))
EOF
)
"${PIP[@]}" -c "$constraints" "${specs[@]}" "${EXTRA_DEPS[@]}" 2>&1 | quiet

site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
rm -rf "$site/torchvision"
cp -r "$HERE/stubs/torchvision" "$site/torchvision"

"$VENV/bin/python" -W ignore -c "
import torch, sglang.version
import sglang.srt.managers.tokenizer_manager, sglang.srt.entrypoints.http_server
print('sglang', sglang.version.__version__, 'torch', torch.__version__, 'imports OK')
" 2>&1 | grep -v "^\[" | tail -1

echo "installed in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"
echo "$VENV/bin/python"
