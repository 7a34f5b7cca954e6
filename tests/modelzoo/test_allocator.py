import platform

import pytest

from modelzoo.allocator import steady_allocator


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="malloc thresholds are a glibc setting")
def test_malloc_thresholds_are_pinned_on_glibc():
    assert steady_allocator() is True
    assert steady_allocator() is True          # once per process; later calls are free
