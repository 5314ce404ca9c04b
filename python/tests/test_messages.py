"""Particles, messages and results from Python: PusH's API on push's runtime."""
import os
import warnings

import torch
import pytest

import push
from conftest import linear, sgd


def echo(particle, *args):
    return args


def test_launch_runs_the_handler_and_p_wait_returns_results_by_future_id(dist):
    pid = dist.p_create(sgd, receive={"ADD": lambda p, a, b: a + b})
    f1 = dist.p_launch(pid, "ADD", 2, 3)
    f2 = dist.p_launch(pid, "ADD", 10, -4)
    assert dist.p_wait([f1, f2]) == {f1._fid: 5, f2._fid: 6}
    assert f1.wait() == 5 and f1.done()
    # PusH's sync=True: waits, returns None.
    assert dist.p_launch(pid, "ADD", 1, 1, sync=True) is None


def test_views_name_their_parameters_and_count_versions(dist):
    def train_and_view(p, other):
        before = p.get(other).wait()
        p.send(other, "STEP").wait()
        after = p.get(other).wait()
        return before.version, after.version, [n for n, _ in after.named_parameters()]

    def step(p):
        p.step(torch.nn.functional.mse_loss, torch.ones(4, 3), torch.zeros(4, 1)).wait()

    a = dist.p_create(None, receive={"RUN": train_and_view})
    b = dist.p_create(sgd, receive={"STEP": step})
    before, after, names = dist.p_launch(a, "RUN", b).wait()
    assert after > before and names == ["weight", "bias"]


def test_values_cross_as_themselves(dist):
    pid = dist.p_create(None, receive={"ECHO": echo})

    class Opaque:
        pass

    thing = Opaque()
    args = (1, 2.5, True, None, "s", [1, "a", [2]], {"k": [3]}, (4, 5), thing, {7: "int key"})
    out = dist.p_launch(pid, "ECHO", *args).wait()
    assert out == args
    assert out[8] is thing  # not a copy: the same object reaches the handler and comes back


def test_tensors_are_not_copied(dist):
    seen = {}

    def keep(particle, t):
        seen["ptr"] = t.data_ptr()
        t.add_(1)
        return t

    pid = dist.p_create(None, receive={"KEEP": keep})
    x = torch.zeros(4)
    y = dist.p_launch(pid, "KEEP", x).wait()
    assert seen["ptr"] == x.data_ptr() == y.data_ptr()
    assert torch.equal(x, torch.ones(4))


def test_a_handler_sends_gets_and_trains():
    def main(p, x, y):
        other = p.other_particles()[0]
        losses = [p.step(torch.nn.functional.mse_loss, x, y).wait().item() for _ in range(20)]
        reply = p.send(other, "ECHO", "ping").wait()
        view = p.get(other).wait()
        return losses[0], losses[-1], reply, view

    def train(p, x, y):
        for _ in range(5):
            p.step(torch.nn.functional.mse_loss, x, y).wait()

    torch.manual_seed(0)
    with push.PusH(lambda: torch.nn.Linear(3, 1)) as dist:
        a = dist.p_create(sgd, receive={"MAIN": main})
        b = dist.p_create(sgd, receive={"ECHO": echo, "TRAIN": train})
        x = torch.randn(32, 3)
        y = x.sum(1, keepdim=True)
        before = dist.p_parameters(b)
        dist.p_launch(b, "TRAIN", x, y).wait()
        after = dist.p_parameters(b)
        assert not torch.equal(before[0], after[0])
        first, last, reply, view = dist.p_launch(a, "MAIN", x, y).wait()
        assert last < first / 10
        assert reply == ("ping",)
        assert view.pid == b
        for got, want in zip(view.parameters(), after):
            assert torch.equal(got, want)
        module = view.view()
        assert isinstance(module, torch.nn.Linear)
        assert torch.equal(module.weight, after[0])


def test_register_receive_from_a_handler(dist):
    def setup(p):
        p.register_receive("LATER", lambda q, v: v * 3, {"registered": True})
        return p.state["registered"]

    pid = dist.p_create(None, receive={"SETUP": setup})
    assert dist.p_launch(pid, "SETUP").wait() is True
    assert dist.p_launch(pid, "LATER", 7).wait() == 21


def test_state_forward_and_ids(dist):
    def look(p, x):
        p.state["n"] = p.state.get("n", 0) + 1
        return p.pid, p.particle_ids(), p.state["n"], p.forward(x).wait().shape, str(p.device)

    pid = dist.p_create(sgd, receive={"LOOK": look}, state={"n": 10})
    other = dist.p_create(sgd)
    assert dist.p_launch(pid, "LOOK", torch.ones(5, 3)).wait() == (pid, [pid, other], 11, torch.Size([5, 1]), "cpu")
    assert dist.particle_ids() == [pid, other]
    assert dist.num_particles() == 2


def test_zero_grad_clears_the_modules_gradients_without_an_optimizer(dist):
    # As in PusH: the module's gradients, every parameter's, also for a particle without an optimizer.
    def clear(p, x):
        p.forward(x).wait().sum().backward()
        before = [t.grad is not None for t in p.module.parameters()]
        p.zero_grad().wait()
        return before, [t.grad for t in p.module.parameters()]

    pid = dist.p_create(None, receive={"CLEAR": clear})
    before, after = dist.p_launch(pid, "CLEAR", torch.ones(5, 3)).wait()
    assert before == [True, True]
    assert after == [None, None]


def test_particles_are_seeded_by_id():
    def params(seed):
        with push.PusH(lambda: torch.nn.Linear(3, 1), seed=seed) as d:
            return [d.p_parameters(d.p_create(None)) for _ in range(2)]

    a, b = params(1), params(1)
    assert all(torch.equal(x, y) for pa, pb in zip(a, b) for x, y in zip(pa, pb))
    assert not torch.equal(a[0][0], a[1][0])
    assert not torch.equal(params(2)[0][0], a[0][0])


def test_handler_threads_are_reused(dist):
    pid = dist.p_create(None, receive={"ECHO": echo})
    for i in range(50):
        assert dist.p_launch(pid, "ECHO", i).wait() == (i,)
    assert dist._core.handler_threads() <= 2


def test_a_module_with_python_only_state_trains():
    import threading

    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
            self.lock = threading.Lock()  # not picklable
            self.scale = lambda t: t * 0.5  # nor this
            self.calls = 0

        def forward(self, x):
            with self.lock:
                self.calls += 1
            return self.scale(self.layer(x))

    def train(p, x, y):
        for _ in range(30):
            loss = p.step(torch.nn.functional.mse_loss, x, y).wait()
        return loss.item(), p.module.calls

    torch.manual_seed(0)
    with push.PusH(Odd) as dist:
        pid = dist.p_create(lambda ps: torch.optim.Adam(ps, lr=0.05), receive={"TRAIN": train})
        x = torch.randn(64, 2)
        loss, calls = dist.p_launch(pid, "TRAIN", x, x[:, :1] * 0.3).wait()
        assert calls == 30 and loss < 0.05
        names = [n for n, _ in dist.p_named_parameters(pid)]
        assert names == ["layer.0.weight", "layer.0.bias", "layer.2.weight", "layer.2.bias"]


def test_save_writes_every_particle(dist, tmp_path):
    for _ in range(3):
        dist.p_create(sgd)
    dist.save(tmp_path / "run")
    assert (tmp_path / "run").is_dir() and any((tmp_path / "run").iterdir())


def test_load_restores_what_save_wrote(tmp_path):
    def make(seed):
        d = push.PusH(lambda: torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)), seed=seed)
        return d, [d.p_create(sgd, receive={"TRAIN": train_once}) for _ in range(3)]

    def train_once(p, x):
        p.module.train()
        return p.step(lambda out, y: out.pow(2).mean(), x, x).wait().item()

    saved, pids = make(1)
    with saved:
        for pid in pids:
            saved.p_launch(pid, "TRAIN", torch.randn(8, 3)).wait()
        saved.save(tmp_path / "ckpt")
        want = [saved.p_named_parameters(pid) for pid in pids]
        stats = saved._slot(0).module[1].running_mean.clone()
    fresh, pids = make(2)
    with fresh:
        module = fresh._slot(0).module
        weight = module[0].weight
        assert not torch.equal(fresh.p_parameters(0)[0], want[0][0][1])
        fresh.load(tmp_path / "ckpt")
        for pid in pids:
            got = fresh.p_named_parameters(pid)
            assert [n for n, _ in got] == [n for n, _ in want[pid]]
            assert all(torch.equal(a, b) for (_, a), (_, b) in zip(got, want[pid]))
        # In place: the Python module's own tensors hold the loaded values (buffers too).
        assert module[0].weight is weight and torch.equal(weight.detach(), want[0][0][1])
        assert torch.equal(module[1].running_mean, stats)
        # It trains on from there.
        assert fresh.p_launch(0, "TRAIN", torch.randn(8, 3)).wait() >= 0


def test_load_refuses_what_does_not_fit(tmp_path):
    with push.PusH(linear) as d:
        for _ in range(2):
            d.p_create(sgd)
        d.save(tmp_path / "two")
    with push.PusH(linear) as d:
        d.p_create(sgd)
        before = d.p_parameters(0)
        with pytest.raises(RuntimeError, match="particle 1"):
            d.load(tmp_path / "two")
        assert all(torch.equal(a, b) for a, b in zip(before, d.p_parameters(0)))
    with push.PusH(lambda: torch.nn.Linear(5, 1)) as d:
        d.p_create(sgd)
        d.p_create(sgd)
        with pytest.raises(RuntimeError, match=r"'weight' is Float\[1, 3\] in the checkpoint but Float\[1, 5\] here"):
            d.load(tmp_path / "two")
    with push.PusH(linear) as d:
        d.p_create(sgd)
        with pytest.raises(RuntimeError, match="checkpoint directory '.*nowhere' does not exist"):
            d.load(tmp_path / "nowhere")
    # Every file of the checkpoint cut short in turn, and with a byte flipped in its middle:
    # named as corrupt, and the particles keep what they had.
    files = sorted(f for f in (tmp_path / "two").rglob("*") if f.is_file())
    assert files
    for f in files:
        whole = f.read_bytes()
        mid = len(whole) // 2
        for damaged in (whole[:mid], whole[:mid] + bytes([whole[mid] ^ 0xFF]) + whole[mid + 1:]):
            f.write_bytes(damaged)
            with push.PusH(linear) as d:
                d.p_create(sgd)
                d.p_create(sgd)
                before = [d.p_parameters(pid) for pid in (0, 1)]
                with pytest.raises(RuntimeError, match=f"checkpoint '.*two' is corrupt: {f.name}"):
                    d.load(tmp_path / "two")
                after = [d.p_parameters(pid) for pid in (0, 1)]
                assert all(torch.equal(a, b) for pa, pb in zip(before, after) for a, b in zip(pa, pb))
        f.write_bytes(whole)


def test_a_state_dict_is_the_particles_own_object_as_in_pusH(dist):
    # PusH keeps the dict it is given: the program sees what handlers write, and particles
    # given one dict share it.
    shared = {"seen": []}

    def note(p):
        p.state["seen"].append(p.pid)
        p.state["last"] = p.pid

    a = dist.p_create(None, receive={"NOTE": note}, state=shared)
    b = dist.p_create(None, receive={"NOTE": note}, state=shared)
    dist.p_wait([dist.p_launch(a, "NOTE")])
    dist.p_wait([dist.p_launch(b, "NOTE")])
    assert shared == {"seen": [a, b], "last": b}


def test_save_without_a_folder_writes_pusHs_files_that_torch_load_reads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def make():
        return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1))

    def train(p, x):
        p.step(lambda out, y: (out - y).pow(2).mean(), x, x[:, :1]).wait()

    with push.PusH(make) as d:
        pids = [d.p_create(lambda ps: torch.optim.SGD(ps, lr=0.1), receive={"TRAIN": train}) for _ in range(2)]
        d.p_wait([d.p_launch(pid, "TRAIN", torch.randn(8, 3)) for pid in pids])
        d.save()
        expected = {pid: d.p_parameters(pid) for pid in pids}
        lanes = {pid: d._core.lane_of(pid) for pid in pids}
    files = sorted(os.listdir(tmp_path / "particles"))
    assert files == sorted(f"device{lanes[pid]}_particle{pid}.pth" for pid in pids)
    for pid in pids:
        module = make()
        module.load_state_dict(torch.load(tmp_path / "particles" / f"device{lanes[pid]}_particle{pid}.pth"))
        assert all(torch.equal(a, b) for a, b in zip(module.parameters(), expected[pid]))
        assert int(module[1].num_batches_tracked) == 1  # buffers too


def test_handlers_compute_with_their_lane_s_intra_op_threads():
    # A handler thread is new: without this its count would be the process's default (every
    # core), whatever the lane's, and its OpenMP team would spin beside the lane's.
    threads = lambda p: torch.get_num_threads()  # noqa: E731
    with push.PusH(linear, devices=1, device_type="cpu", intra_op_threads=1) as d:
        pid = d.p_create(None, receive={"T": threads})
        assert d.p_launch(pid, "T").wait() == 1
    # torch.set_num_threads lowered below the cores is the lanes' count by default.
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with push.PusH(linear, devices=1, device_type="cpu") as d:
            pid = d.p_create(None, receive={"T": threads})
            assert d.p_launch(pid, "T").wait() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="intra_op_threads must be >= 1"):
        push.PusH(linear, intra_op_threads=0)


def _adam_steplr():
    mk_optim = lambda ps: torch.optim.Adam(ps, lr=0.05)  # noqa: E731
    mk_sched = lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5)  # noqa: E731
    return mk_optim, mk_sched


def _train_steps(p, n):
    x = torch.linspace(-1, 1, 8).unsqueeze(1).repeat(1, 3)
    for _ in range(n):
        p.step(lambda out, y: (out - y).pow(2).mean(), x, x[:, :1] * 2).wait()
        p.scheduler_step().wait()


def test_save_keeps_the_python_optimizer_and_scheduler_so_training_resumes_exactly(tmp_path):
    mk_optim, mk_sched = _adam_steplr()

    def make(seed):
        d = push.PusH(linear, seed=seed)
        return d, [d.p_create(mk_optim, mk_sched, receive={"TRAIN": _train_steps}) for _ in range(2)]

    d, pids = make(1)
    with d:
        d.p_wait([d.p_launch(pid, "TRAIN", 3) for pid in pids])
        d.save(tmp_path / "ckpt")
        d.p_wait([d.p_launch(pid, "TRAIN", 3) for pid in pids])
        want = [d.p_parameters(pid) for pid in pids]
        lr = d._slot(0).optimizer.param_groups[0]["lr"]
        # Back into the same particles, which trained on (moments and a halved rate of their
        # own): the next three steps retrace the first run's.
        d.load(tmp_path / "ckpt")
        assert d._slot(0).optimizer.param_groups[0]["lr"] == 0.05 * 0.5
        d.p_wait([d.p_launch(pid, "TRAIN", 3) for pid in pids])
        assert all(torch.equal(a, b) for pid in pids for a, b in zip(d.p_parameters(pid), want[pid]))
        assert d._slot(0).optimizer.param_groups[0]["lr"] == lr
        # Nothing of it stays in the particles' state after the save.
        assert d.p_launch(0, "push.python/take", "push.python.optimizer").wait() is None
    fresh, pids = make(2)
    with fresh:
        fresh.load(tmp_path / "ckpt")
        fresh.p_wait([fresh.p_launch(pid, "TRAIN", 3) for pid in pids])
        assert all(torch.equal(a, b) for pid in pids for a, b in zip(fresh.p_parameters(pid), want[pid]))


def test_some_particles_save_alone_and_save_to_disk_writes_pusHs_file(tmp_path):
    mk_optim, mk_sched = _adam_steplr()
    with push.PusH(linear) as d:
        pids = [d.p_create(mk_optim, mk_sched, receive={"TRAIN": _train_steps}) for _ in range(3)]
        d.p_wait([d.p_launch(pid, "TRAIN", 2) for pid in pids])
        d.save(tmp_path / "one", pids=[1])
        saved = d.p_parameters(1)
        d.p_wait([d.p_launch(pid, "TRAIN", 2) for pid in pids])
        others = [d.p_parameters(pid) for pid in (0, 2)]
        with pytest.raises(RuntimeError, match="particles 0, 2 exist here but not in checkpoint"):
            d.load(tmp_path / "one")
        moments = [d._slot(pid).optimizer.state_dict()["state"][0]["exp_avg"].clone() for pid in (0, 2)]
        d.load_particles(tmp_path / "one")
        assert all(torch.equal(a, b) for a, b in zip(d.p_parameters(1), saved))
        # The particles the folder does not hold keep their optimizers' state too.
        for pid, m in zip((0, 2), moments):
            assert torch.equal(d._slot(pid).optimizer.state_dict()["state"][0]["exp_avg"], m)
        assert all(torch.equal(a, b) for pid, want in zip((0, 2), others) for a, b in zip(d.p_parameters(pid), want))
        d.save_to_disk(2, tmp_path / "pusH")
        assert os.listdir(tmp_path / "pusH") == [f"device{d._core.lane_of(2)}_particle2.pth"]
        module = linear()
        module.load_state_dict(torch.load(tmp_path / "pusH" / os.listdir(tmp_path / "pusH")[0]))
        assert all(torch.equal(a, b) for a, b in zip(module.parameters(), d.p_parameters(2)))
        with pytest.raises(KeyError, match="particle 7 does not exist"):
            d.save(tmp_path / "none", pids=[7])
        with pytest.raises(ValueError, match="'push.python/' are push's own"):
            d.p_create(None, receive={"push.python/mine": lambda p: None})


def test_a_scheduler_holding_a_function_saves_and_resumes_exactly(tmp_path):
    # OneCycleLR's state holds a bound method on torch 1.13: save leaves it out (its
    # constructor makes it again) instead of failing, and training resumes to the bit.
    mk_optim = lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)  # noqa: E731
    mk_sched = lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=20)  # noqa: E731

    def make(seed):
        d = push.PusH(linear, seed=seed)
        return d, d.p_create(mk_optim, mk_sched, receive={"TRAIN": _train_steps})

    d, pid = make(1)
    with d:
        d.p_launch(pid, "TRAIN", 4).wait()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            d.save(tmp_path / "ckpt")
        d.p_launch(pid, "TRAIN", 4).wait()
        want = d.p_parameters(pid)
    fresh, pid = make(2)
    with fresh:
        fresh.load(tmp_path / "ckpt")
        fresh.p_launch(pid, "TRAIN", 4).wait()
        assert all(torch.equal(a, b) for a, b in zip(fresh.p_parameters(pid), want))


def test_push_s_own_messages_cannot_be_taken_and_an_empty_distribution_saves(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with push.PusH(linear) as d:
        d.save()  # nothing to write, nothing to fail
        d.save(tmp_path / "empty")
        pid = d.p_create(None, receive={"TAKE": lambda p: p.register_receive("push.python/take", lambda q, k: 1)})
        with pytest.raises(ValueError, match="'push.python/' are push's own"):
            d.p_launch(pid, "TAKE").wait()
