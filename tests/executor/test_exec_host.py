"""executor.host: the cores and memory this host gives the executor's ranks, container limits included."""

from __future__ import annotations

import pytest


def test_available_cores_measures_again_while_short_and_keeps_the_most(monkeypatch):
    import executor.host as v
    for usable, readings, want, tries in ((2.0, [1.78, 1.99], 1.99, 2),    # our probes' load, gone a moment later
                                          (2.0, [1.5, 1.4, 1.5], 1.5, 3),   # other load stays: every try reads it
                                          (2.0, [2.0], 2.0, 1),             # a quiet host: one try
                                          (1.5, [1.49], 1.49, 1)):          # a container's quota: full at 1.5
        calls = iter(readings)
        seen = []
        monkeypatch.setattr(v, "usable_cores", lambda: usable)
        monkeypatch.setattr(v, "_cores_now", lambda seconds, n: seen.append(n) or next(calls))
        assert v.available_cores() == want and seen == [2] * tries


def test_usable_cores_are_the_affinity_capped_by_the_quotas_of_the_cgroup_and_those_above_it(tmp_path,
                                                                                              monkeypatch):
    import executor.host as v
    monkeypatch.setattr(v.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    mine = tmp_path / "proc_self_cgroup"
    mine.write_text("0::/job/step\n")
    (tmp_path / "job" / "step").mkdir(parents=True)
    usable = lambda: v.usable_cores(str(tmp_path), str(mine))
    assert usable() == 4.0                                         # no cpu.max anywhere
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "job" / "cpu.max").write_text("250000 100000\n")   # a parent's quota: 2.5 CPUs
    assert usable() == 2.5
    (tmp_path / "job" / "step" / "cpu.max").write_text("not a quota\n")
    assert usable() == 2.5
    (tmp_path / "job" / "step" / "cpu.max").write_text("50000 100000\n")
    assert usable() == 0.5
    monkeypatch.setattr(v.os, "sched_getaffinity", lambda pid: {0})
    (tmp_path / "job" / "step" / "cpu.max").write_text("max 100000\n")
    assert usable() == 1.0                                         # the affinity mask, below the quotas
    assert v.usable_cores(str(tmp_path / "absent"), str(tmp_path / "absent")) == 1.0


def test_usable_cores_read_cgroup_v1_quotas_on_the_cpu_controllers_mount(tmp_path, monkeypatch):
    import executor.host as v
    monkeypatch.setattr(v.os, "sched_getaffinity", lambda pid: set(range(8)))
    mine = tmp_path / "proc_self_cgroup"
    mine.write_text("12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n")
    cpu = tmp_path / "cpu,cpuacct"
    (cpu / "docker" / "abc").mkdir(parents=True)
    usable = lambda: v.usable_cores(str(tmp_path), str(mine))
    (cpu / "docker" / "abc" / "cpu.cfs_quota_us").write_text("-1\n")      # no quota
    (cpu / "docker" / "abc" / "cpu.cfs_period_us").write_text("100000\n")
    assert usable() == 8.0
    (cpu / "docker" / "abc" / "cpu.cfs_quota_us").write_text("150000\n")
    assert usable() == 1.5
    # Inside the container the mount's root is the container's own cgroup.
    (cpu / "docker" / "abc" / "cpu.cfs_quota_us").write_text("-1\n")
    (cpu / "cpu.cfs_quota_us").write_text("300000\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    assert usable() == 3.0


@pytest.mark.parametrize("layout", ["v2", "v1"])
def test_host_memory_is_the_physical_memory_capped_by_the_cgroups_limits(tmp_path, monkeypatch, layout):
    import executor.host as v
    pages = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 1 << 20}     # 4 GiB
    monkeypatch.setattr(v.os, "sysconf", lambda name: pages[name])
    mine = tmp_path / "proc_self_cgroup"
    mine.write_text("0::/job/step\n" if layout == "v2" else "9:memory:/job/step\n")
    base = tmp_path if layout == "v2" else tmp_path / "memory"
    (base / "job" / "step").mkdir(parents=True)
    limit, none = ("memory.max", "max\n") if layout == "v2" else ("memory.limit_in_bytes", "9223372036854771712\n")
    memory = lambda: v.host_memory_bytes(str(tmp_path), str(mine))
    assert memory() == 4 << 30
    (base / "job" / "step" / limit).write_text(none)                     # no limit
    assert memory() == 4 << 30
    (base / "job" / limit).write_text(f"{3 << 30}\n")                    # a parent's limit
    assert memory() == 3 << 30
    (base / "job" / "step" / limit).write_text(f"{1 << 30}\n")
    assert memory() == 1 << 30
    assert v.host_memory_bytes(str(tmp_path / "absent"), str(tmp_path / "absent")) == 4 << 30


def test_a_hybrid_layouts_separate_cpuacct_line_is_not_read_as_the_cpu_controllers(tmp_path, monkeypatch):
    import executor.host as v
    monkeypatch.setattr(v.os, "sched_getaffinity", lambda pid: set(range(8)))
    mine = tmp_path / "proc_self_cgroup"
    mine.write_text("3:cpuacct:/other\n1:cpu:/mine\n0::/\n")       # as on hosts mounting them apart
    for folder, quota in (("other", "100000"), ("mine", "400000")):
        (tmp_path / "cpu" / folder).mkdir(parents=True)
        (tmp_path / "cpu" / folder / "cpu.cfs_quota_us").write_text(quota)
        (tmp_path / "cpu" / folder / "cpu.cfs_period_us").write_text("100000")
    assert v.usable_cores(str(tmp_path), str(mine)) == 4.0
    (tmp_path / "cpu.max").write_text("300000 100000\n")            # the v2 root's, in a hybrid layout
    assert v.usable_cores(str(tmp_path), str(mine)) == 3.0


def test_without_proc_self_cgroup_the_mounts_roots_are_read(tmp_path, monkeypatch):
    import executor.host as v
    monkeypatch.setattr(v.os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 1 << 20}[name])
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text(f"{1 << 30}\n")
    assert v.host_memory_bytes(str(tmp_path), str(tmp_path / "absent")) == 1 << 30
