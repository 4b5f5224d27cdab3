#!/usr/bin/env bash
# Creates benchmarks/.peers-venv with the peer loaders (MosaicML streaming, webdataset) apart from
# the platform's .venv: mosaicml-streaming pulls torchvision and would downgrade the platform's numpy.
# simplejpeg is the JPEG decoder that benchmarks/typed_loaders.py gives every image loader, peers included.
# streaming imports torchvision when imported, and PyPI's torchvision only imports beside a matching
# torch, hence the torch/torchvision pair below (both install from this machine's local wheels).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.peers-venv"
py="${PYTHON:-python3}"
test -x "$venv/bin/python" || "$py" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet \
    "torch==2.14.1" "torchvision==0.29.1" "mosaicml-streaming==0.13.0" "webdataset" "pandas" "numpy" "simplejpeg"
"$venv/bin/python" - <<'PY'
import numpy, simplejpeg, streaming, torch, torchvision, webdataset, pandas
print("peers venv ok: torch", torch.__version__, "torchvision", torchvision.__version__,
      "streaming", streaming.__version__, "webdataset", getattr(webdataset, "__version__", "?"),
      "numpy", numpy.__version__, "pandas", pandas.__version__)
PY
touch "$venv/.installed"
