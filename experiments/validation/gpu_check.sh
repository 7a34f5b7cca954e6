#!/usr/bin/env bash
# The CUDA checks, as one command for a machine with a GPU and no network (docs/validation.md, "On a GPU").
# Writes five files to $OUT (default experiments/results/gpu): env.txt, pytest_cuda.txt, the
# quick suite's validation_cuda_quick.{csv,md} and tp.tgz (the TP plans' prediction/measurement reports).
# Python packages the machine lacks (simpy at least) travel as wheels in .whl/ (see the docs).
# DEVICE=cpu runs the same steps on CPU ranks (a check of this script where there is no GPU).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-experiments/results/gpu}
DEVICE=${DEVICE:-cuda}
WAVES=${WAVES:-20}
mkdir -p "$OUT"
work=$(mktemp -d)
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1

{ date -u; nvidia-smi -L 2>/dev/null; python3 -c "import torch; print('torch', torch.__version__, 'cuda',
torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')"; } >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

python3 -m pytest -q -p no:cacheprovider tests/executor/test_exec_cuda.py >"$OUT/pytest_cuda.txt" 2>&1
tail -3 "$OUT/pytest_cuda.txt"

python3 experiments/validation/run.py --device "$DEVICE" --quick --out "$work" --stem validation_cuda_quick
cp "$work"/validation_cuda_quick.csv "$work"/validation_cuda_quick.md "$OUT"/ 2>/dev/null

# Tensor parallelism on the device: every rank shares this machine's GPU(s); the memory is the ranks' peak
# allocation (torch.cuda.max_memory_allocated) where they run on CUDA.
for plan in tp2_gpt pp2_tp2_gpt; do
    python3 -m hetsim validate --plan "experiments/validation/plans/$plan.json" --device "$DEVICE" \
        --model-arg n_layer=2 --model-arg seq_len=128 --waves "$WAVES" --quiet --out "$work/$plan" \
        | tee "$work/$plan.txt"
done
tar czf "$OUT/tp.tgz" -C "$work" tp2_gpt tp2_gpt.txt pp2_tp2_gpt pp2_tp2_gpt.txt 2>/dev/null
ls -l "$OUT"
