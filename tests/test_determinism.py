"""Same inputs and seed give the same simulation, bit for bit (a golden file guards it)."""

import os
from pathlib import Path

import hetsim

GOLDEN = Path(__file__).parent / "golden" / "builtin_report.json"
ARGS = dict(waves=6, seed=3, jitter_cv=0.1, slowdown={"node2/gpu1": 1.3}, trace=False)


def test_same_inputs_and_seed_give_byte_identical_reports():
    assert hetsim.simulate(**ARGS).to_json() == hetsim.simulate(**ARGS).to_json()


def test_report_matches_the_golden_file():
    text = hetsim.simulate(**ARGS).to_json()
    if os.environ.get("HETSIM_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "regenerate with HETSIM_UPDATE_GOLDEN=1 only for an intended change"


def test_trace_is_deterministic_too():
    a = hetsim.simulate(waves=4, seed=1, jitter_cv=0.2).trace.to_dict()
    b = hetsim.simulate(waves=4, seed=1, jitter_cv=0.2).trace.to_dict()
    assert a == b
