"""The sweep's point queue: one worker per configuration while others are free."""

import threading

from rl_batch.sweeps import dispatch


def _queue(counts: dict[str, int]) -> dispatch.PointQueue:
    points = [(config, seed) for config, n in counts.items() for seed in range(n)]
    return dispatch.PointQueue(points, lambda point: point[0])


def test_two_workers_start_different_configurations_and_stay_on_them():
    q = _queue({"A": 3, "B": 3, "C": 1})
    # In grid order (the seeds adjacent) both workers would have started A.
    assert q.next(0) == ("A", 0)
    assert q.next(1) == ("B", 0)
    assert q.next(0) == ("A", 1)
    assert q.next(0) == ("A", 2)
    # A has no seed left: worker 0 takes the first configuration nobody is on.
    assert q.next(0) == ("C", 0)
    # Nothing free: it joins the configuration with the most points left (B).
    assert q.next(0) == ("B", 1)
    assert q.next(1) == ("B", 2)
    assert q.next(0) is None and q.next(1) is None


def test_every_point_is_handed_out_once_across_threads():
    counts = {f"c{i}": 5 + i for i in range(6)}
    q = _queue(counts)
    got: list[list[tuple[str, int]]] = [[] for _ in range(4)]

    def drain(worker: int) -> None:
        while (item := q.next(worker)) is not None:
            got[worker].append(item)

    threads = [threading.Thread(target=drain, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    handed = sorted(point for worker in got for point in worker)
    assert handed == sorted((c, seed) for c, n in counts.items() for seed in range(n))


def test_a_closed_queue_hands_out_nothing():
    q = _queue({"A": 2})
    q.close()
    assert q.next(0) is None
