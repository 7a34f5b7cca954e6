"""The HetPipe experiment's --quick run, as CI runs it: a table row per policy and D, and a figure."""

import csv
import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "hetpipe" / "run.py"


def test_quick_run_writes_table_and_figure(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("hetpipe_run", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module            # dataclasses look their module up there
    spec.loader.exec_module(module)
    assert module.main(["--quick", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(tmp_path / "throughput.csv")))
    config = module.quick(module.Config())
    vgg = [r for r in rows if r["model"] == "VGG-19"]
    assert {(r["policy"], int(r["D"])) for r in vgg} >= {(p, d) for p in config.policies for d in config.staleness}
    assert any(r["policy"] == "Horovod (BSP)" for r in vgg)
    assert all(float(r["samples_per_s"]) > 0 for r in rows)
    assert (tmp_path / "throughput.png").stat().st_size > 0
    assert "| VGG-19 | ED |" in (tmp_path / "throughput.md").read_text()
