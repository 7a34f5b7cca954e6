"""What a stage keeps in GPU memory: weights, gradients, optimiser state, stashed weight versions and
the activations of every minibatch in flight (PipeDream weight stashing; HetPipe's Nm)."""

from __future__ import annotations

from dataclasses import dataclass

from hetsim.profile import ModelProfile

__all__ = ["StageMemory", "stage_memory"]

GIB = 1024**3


@dataclass(frozen=True, kw_only=True)
class StageMemory:
    weights_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    stash_bytes: int
    activation_bytes: int
    versions: int                 # weight versions held (1 + stashed)
    in_flight: int

    @property
    def total_bytes(self) -> int:
        return (self.weights_bytes + self.gradient_bytes + self.optimizer_bytes + self.stash_bytes
                + self.activation_bytes)

    def describe(self) -> str:
        g = lambda b: f"{b / GIB:.2f}"
        parts = [f"weights {g(self.weights_bytes)}", f"gradients {g(self.gradient_bytes)}"]
        if self.optimizer_bytes:
            parts.append(f"optimizer {g(self.optimizer_bytes)}")
        if self.stash_bytes:
            parts.append(f"{self.versions - 1} stashed versions {g(self.stash_bytes)}")
        parts.append(f"activations of {self.in_flight} minibatches {g(self.activation_bytes)}")
        return " + ".join(parts)


def stage_memory(profile: ModelProfile, lo: int, hi: int, *, in_flight: int, asynchronous: bool,
                 optimizer_state_copies: int = 1) -> StageMemory:
    """Peak bytes of a stage running layers [lo, hi) with `in_flight` minibatches at once.

    Activations: every layer output of the stage plus its input, per in-flight minibatch (an upper
    bound: frameworks free some, e.g. in-place ReLU). Asynchronous schedules stash one weight version
    per in-flight minibatch; flush schedules hold one version.
    """
    weights = profile.stage_param_bytes(lo, hi)
    versions = max(1, in_flight) if asynchronous else 1
    per_minibatch = profile.stage_output_bytes_sum(lo, hi) + profile.cut_bytes(lo)
    return StageMemory(weights_bytes=weights, gradient_bytes=weights,
                       optimizer_bytes=weights * optimizer_state_copies,
                       stash_bytes=weights * (versions - 1), activation_bytes=per_minibatch * in_flight,
                       versions=versions, in_flight=in_flight)
