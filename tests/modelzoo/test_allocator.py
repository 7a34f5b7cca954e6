import platform

import pytest

from modelzoo.allocator import steady_allocator


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="malloc thresholds are a glibc setting")
def test_malloc_thresholds_are_pinned_on_glibc():
    assert steady_allocator() is True
    assert steady_allocator() is True          # once per process; later calls are free


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="malloc thresholds are a glibc setting")
def test_a_block_above_the_mmap_ceiling_is_reused_without_page_faults():
    import resource

    import torch
    steady_allocator()
    n = 12_000_000                               # 48 MB: above glibc's largest mmap threshold
    torch.empty(n).fill_(1.0)                    # first touch: the heap grows once
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.empty(n).fill_(2.0)                    # the freed block again, its pages still mapped
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < n * 4 // 4096 // 10          # mapped fresh, it would fault in ~11,700 pages
