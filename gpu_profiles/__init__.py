"""Data shipped with hetsim: GPU datasheets, clusters, model profiles and example plans.

Files only; `hetsim.data` finds them whether hetsim runs from a checkout or an installed wheel.
"""
