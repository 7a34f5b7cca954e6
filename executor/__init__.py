"""The reference executor: run a hetsim plan for real with torch.distributed and measure it.

    report = executor.launch("plan.json", "cluster.yaml", "mlp", options=ExecOptions(waves=8))

Each (virtual worker, stage) is a process that replays its actions of hetsim's schedule IR (the same
IR the simulator interprets); WSP adds parameter-server processes. Measurements come back as a
hetsim Report (kind "measurement") with a Chrome trace in the simulator's format.
"""

from executor.launch import launch, make_job
from executor.options import ExecOptions

__all__ = ["launch", "make_job", "ExecOptions"]
