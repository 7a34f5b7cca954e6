"""The notes saying what a prediction approximates for the GPUs, profile and training it uses: shared
by the simulation report (hetsim.sim.summary) and `hetsim plan`'s ranking, so both say the same."""

from __future__ import annotations

from hetsim.cluster import Cluster
from hetsim.derive import bf16_note
from hetsim.memory import unreserved_note
from hetsim.profile import ModelProfile, precision_note, tp_note, tp_split_note, update_note

__all__ = ["caveats"]


def caveats(profile: ModelProfile, cluster: Cluster, groups: set[tuple[str, int]], precision: str,
            gpus=None) -> list[str]:
    """The notes for stages of the (GPU type, TP degree) `groups` trained at `precision` on `gpus` (GPU
    ids; default every GPU of `cluster`), whose types the memory-reserve and bf16 notes name."""
    used = [cluster.gpu(g).type for g in gpus] if gpus is not None else [g.type for g in cluster.gpus]
    types = list({t.name: t for t in used}.values())
    notes = (unreserved_note(cluster, gpus), precision_note(profile, precision), tp_note(profile, groups),
             tp_split_note(profile, {t for _, t in groups}), bf16_note(types, precision), update_note(profile, groups))
    return [n for n in notes if n]
