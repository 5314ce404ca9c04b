"""Handlers that wait on each other: chains, cycles, across lanes and from many threads."""
import threading

import pytest
import torch

import push


def chain(p, depth):
    # Each particle asks the next; the last answers. Every handler waits on the next one.
    if depth == 0:
        return 0
    nxt = (p.pid + 1) % len(p.particle_ids())
    return 1 + p.send(nxt, "CHAIN", depth - 1).wait()


@pytest.mark.parametrize("particles,depth", [(1, 5), (3, 30), (8, 64)])
def test_chains_of_waits(particles, depth):
    with push.PusH(lambda: torch.nn.Linear(2, 2)) as dist:
        pids = [dist.p_create(None, receive={"CHAIN": chain}) for _ in range(particles)]
        assert dist.p_launch(pids[0], "CHAIN", depth).wait(timeout=60) == depth


def ping(p, n):
    # A cycle: 0 asks 1, which asks 0 again, while 0's first handler is still waiting.
    if n == 0:
        return [p.pid]
    other = p.other_particles()[0]
    return [p.pid] + p.send(other, "PING", n - 1).wait()


def test_a_cycle_of_waits_between_two_particles():
    with push.PusH(lambda: torch.nn.Linear(2, 2)) as dist:
        a = dist.p_create(None, receive={"PING": ping})
        b = dist.p_create(None, receive={"PING": ping})
        assert dist.p_launch(a, "PING", 6).wait(timeout=60) == [a, b, a, b, a, b, a]


def fan_out(p):
    # One handler waits on all the others at once, each of which waits on a view of it.
    futures = [p.send(q, "VIEW", p.pid) for q in p.other_particles()]
    return p.wait(futures)


def view_of(p, pid):
    view = p.get(pid).wait()
    return p.pid, view.pid, view.parameters()[0]


def test_fan_out_and_views_from_every_particle():
    with push.PusH(lambda: torch.nn.Linear(2, 2)) as dist:
        pids = [dist.p_create(None, receive={"FAN": fan_out, "VIEW": view_of}) for _ in range(6)]
        weight = dist.p_parameters(pids[0])[0]
        results = dist.p_launch(pids[0], "FAN").wait(timeout=60)
        assert [r[0] for r in results] == pids[1:]
        for _, viewed, w in results:
            assert viewed == pids[0] and torch.equal(w, weight)


def trainer(p, x, y, steps, nop):
    # Every step is followed by a wait (a message to another particle), where the lane may
    # serve others: a view of this particle then, and only then.
    history = [[t.detach().clone() for t in p.module.parameters()]]
    for _ in range(steps):
        p.step(torch.nn.functional.mse_loss, x, y).wait()
        history.append([t.detach().clone() for t in p.module.parameters()])
        p.send(nop, "NOP").wait()
    return history


def watcher(p, target, n, nop):
    seen = []
    for _ in range(n):
        seen.append([t.clone() for t in p.get(target).wait().parameters()])
        p.send(nop, "NOP").wait()  # lets the trainer go on
    return seen


def test_views_of_a_training_particle_are_states_it_passed_through():
    torch.manual_seed(0)
    with push.PusH(lambda: torch.nn.Linear(3, 1)) as dist:
        a = dist.p_create(lambda ps: torch.optim.SGD(ps, lr=0.05), receive={"TRAIN": trainer})
        b = dist.p_create(None, receive={"WATCH": watcher})
        c = dist.p_create(None, receive={"NOP": lambda p: None})
        x = torch.randn(64, 3)
        y = x.sum(1, keepdim=True)
        train = dist.p_launch(a, "TRAIN", x, y, 200, c)
        seen = dist.p_launch(b, "WATCH", a, 50, c).wait(timeout=120)
        history = train.wait(timeout=120)
        states = {tuple(torch.cat([t.flatten() for t in h]).tolist()) for h in history}
        for view in seen:
            assert tuple(torch.cat([t.flatten() for t in view]).tolist()) in states
        assert len({tuple(torch.cat([t.flatten() for t in v]).tolist()) for v in seen}) > 1


def test_launches_from_many_user_threads():
    with push.PusH(lambda: torch.nn.Linear(2, 2)) as dist:
        pids = [dist.p_create(None, receive={"CHAIN": chain}) for _ in range(4)]
        results, errors = [], []

        def user(i):
            try:
                results.append(dist.p_launch(pids[i % 4], "CHAIN", 10).wait(timeout=60))
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        threads = [threading.Thread(target=user, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and results == [10] * 8


def test_threads_a_handler_starts_wait_through_it():
    # On one lane, held by the handler while it runs: its helper threads' waits go through
    # the handler's fiber, or they could never see the other particle run.
    from concurrent.futures import ThreadPoolExecutor

    def fan(p):
        with ThreadPoolExecutor(4) as pool:
            return sorted(pool.map(lambda q: p.send(q, "ECHO", q).wait(timeout=60), p.other_particles()))

    with push.PusH(lambda: torch.nn.Linear(2, 2), devices=1) as dist:
        a = dist.p_create(None, receive={"FAN": fan})
        others = [dist.p_create(None, receive={"ECHO": lambda p, v: v * 10}) for _ in range(5)]
        assert dist.p_launch(a, "FAN").wait(timeout=60) == [q * 10 for q in others]


def _train_all(cache_size):
    # Eight particles on one lane, each training with waits between its steps, so that the
    # lane runs the others (and, with a small cache, swaps them out) in the middle.
    def train(p, x, y, nop):
        for _ in range(20):
            p.step(torch.nn.functional.mse_loss, x, y).wait()
            p.send(nop, "NOP").wait()

    torch.manual_seed(0)
    x = torch.randn(32, 3)
    y = x.sum(1, keepdim=True)
    with push.PusH(lambda: torch.nn.Linear(3, 1), devices=1, cache_size=cache_size) as dist:
        nop = dist.p_create(None, receive={"NOP": lambda p: None})
        pids = [dist.p_create(lambda ps: torch.optim.Adam(ps, lr=0.01), receive={"TRAIN": train}) for _ in range(8)]
        dist.p_wait([dist.p_launch(pid, "TRAIN", x, y, nop) for pid in pids])
        stats = dist._core.cache_stats(0)
        return [dist.p_parameters(pid) for pid in pids], stats["evictions"], stats["resident"]


def test_a_cache_size_computed_with_a_division_is_cut_to_a_count_as_pusH_does():
    # PusH's tutorial computes cache_size with '/': a float, which PusH cuts with int().
    # The particles resident at the end show the cache's size (nine particles fill it); the
    # count of evictions depends on when the handler threads' messages reach the lane.
    (cut, cut_evictions, cut_resident), (whole, _, whole_resident) = _train_all(8 / 3), _train_all(2)
    assert cut_resident == whole_resident == 2 and cut_evictions > 0
    assert all(torch.equal(a, b) for pa, pb in zip(cut, whole) for a, b in zip(pa, pb))


def test_python_particles_swapped_out_train_as_resident_ones():
    (swapped, evictions, _), (resident, none, _) = _train_all(2), _train_all(16)
    assert evictions > 0 and none == 0
    assert all(torch.equal(a, b) for pa, pb in zip(swapped, resident) for a, b in zip(pa, pb))
