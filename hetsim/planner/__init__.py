"""The planner: partition a model over virtual workers of unequal GPUs and rank whole plans.

Pure functions over profiles and clusters (no simpy, no torch); only the last ranking step of
`search_plans` runs the simulator. One module per mechanism:

    chain       PipeDream's DP for identical GPUs (replication, hierarchical bandwidth)
    antichain   augmented antichains -> states in topological order -> the chain DP
    hetero      contiguous stages over an ordered list of unequal GPUs, and the GPU order
    allocation  HetPipe's NP / ED / HD and the automatic set of allocations
    estimate    closed-form throughput used to prune, and an upper bound of any simulated rate
    bounds      best-first order of candidates, refining cheap upper bounds only when needed
    memo        one partition per VW shape, relabelled onto every VW of that shape
    tp_groups   tensor-parallel groups of one node as single pipeline-stage devices
    search      candidates x Nm x D, bounded, estimated, the best simulated (branch and bound)
"""

from hetsim.planner.allocation import POLICIES, Allocation, allocate
from hetsim.planner.antichain import antichain_partition, antichain_states
from hetsim.planner.chain import chain_costs, hierarchical_partition, pipedream_partition
from hetsim.planner.estimate import Estimate, wsp_estimate
from hetsim.planner.hetero import VwPartition, partition_ordered, partition_vw
from hetsim.planner.search import Candidate, SearchResult, SearchSpace, search_plans

__all__ = ["POLICIES", "Allocation", "allocate", "antichain_partition", "antichain_states", "chain_costs",
           "hierarchical_partition", "pipedream_partition", "Estimate", "wsp_estimate", "VwPartition",
           "partition_ordered", "partition_vw", "Candidate", "SearchResult", "SearchSpace", "search_plans"]
