"""The SimPy model: GPUs, links, pipelines and synchronisation. Only this package imports simpy."""

from hetsim.sim.engine import SimOptions, run_simulation

__all__ = ["SimOptions", "run_simulation"]
