"""hetsim.fanout: results in item order on any number of workers, progress per item, errors raised."""

import time

import pytest

from hetsim.fanout import fan_out


def _slow_square(x: int) -> int:
    time.sleep(0.05 * (4 - x))               # later items finish first
    return x * x


def _fail_on_two(x: int) -> int:
    if x == 2:
        raise ValueError("two")
    return x


class _Count:
    def __init__(self):
        self.n = 0

    def update(self, n: int = 1) -> None:
        self.n += n


@pytest.fixture(scope="module")
def scheduler():
    from distributed import LocalCluster
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        yield cluster.scheduler_address


def test_results_come_back_in_item_order_whatever_order_they_finish(scheduler):
    bar = _Count()
    assert fan_out(_slow_square, range(5), scheduler=scheduler, bar=bar) == [0, 1, 4, 9, 16]
    assert bar.n == 5


def test_an_exception_in_a_task_is_raised(scheduler):
    with pytest.raises(ValueError, match="two"):
        fan_out(_fail_on_two, [1, 2, 3, 4], scheduler=scheduler)


def test_one_worker_or_few_items_run_in_this_process_without_a_cluster():
    local = []                              # only this process can append to it
    assert fan_out(lambda x: local.append(x) or x, [1, 2, 3, 4, 5], workers=1) == [1, 2, 3, 4, 5]
    assert fan_out(lambda x: local.append(x) or -x, [7, 8], workers=8) == [-7, -8]
    assert local == [1, 2, 3, 4, 5, 7, 8]
