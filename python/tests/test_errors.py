"""Bad input and failing handlers: a Python exception naming the problem, never a crash."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import push
import push.bayes
from conftest import sgd


def test_a_handler_exception_reaches_p_wait_naming_the_particle(dist):
    def bad(p, x):
        raise ValueError(f"bad input {x}")

    pid = dist.p_create(None, receive={"BAD": bad})
    with pytest.raises(ValueError, match="bad input 7") as info:
        dist.p_wait([dist.p_launch(pid, "BAD", 7)])
    assert any(f"particle {pid}, message 'BAD'" in note for note in info.value.__notes__)


def test_an_exception_passes_through_waiting_particles(dist):
    def inner(p):
        raise KeyError("deep")

    def outer(p):
        return p.send(p.other_particles()[0], "INNER").wait()

    a = dist.p_create(None, receive={"OUTER": outer})
    b = dist.p_create(None, receive={"INNER": inner})
    with pytest.raises(KeyError, match="deep") as info:
        dist.p_launch(a, "OUTER").wait()
    notes = "\n".join(info.value.__notes__)
    assert f"particle {b}, message 'INNER'" in notes and f"particle {a}, message 'OUTER'" in notes


def test_an_unknown_message_names_the_particle_and_its_messages(dist):
    pid = dist.p_create(None, receive={"KNOWN": lambda p: 1})
    with pytest.raises(push.ParticleError, match=rf"particle {pid}.*unknown message 'NOPE'.*'KNOWN'"):
        dist.p_launch(pid, "NOPE").wait()


def test_bad_arguments_raise_the_python_exceptions_users_expect(dist):
    pid = dist.p_create(sgd)
    with pytest.raises(KeyError, match="particle 99 does not exist"):
        dist.p_launch(99, "X")
    with pytest.raises(ValueError, match="particle 99 does not exist"):  # what PusH raised
        dist.p_launch(99, "X")
    with pytest.raises(TypeError, match="particle id is an int"):
        dist.p_launch("0", "X")
    with pytest.raises(TypeError, match="message name is a str"):
        dist.p_launch(pid, 5)
    with pytest.raises(TypeError, match="handler for message 'M' is not callable"):
        dist.p_create(None, receive={"M": 3})
    with pytest.raises(TypeError, match="mk_optim must be callable"):
        dist.p_create("sgd")
    with pytest.raises(ValueError, match="device 5 does not exist"):
        dist.p_create(None, device=5)
    with pytest.raises(TypeError, match="device is a lane index"):
        dist.p_create(None, device="cuda")
    with pytest.raises(TypeError, match="mk_scheduler must be callable"):
        dist.p_create(sgd, 0.1)
    with pytest.raises(TypeError, match="train_key is an int seed"):
        dist.p_create(sgd, None, False, "seven")
    with pytest.raises(ValueError, match=r"train_key must be in \[0, 2\*\*64\)"):
        dist.p_create(sgd, None, False, -5)
    with pytest.raises(ValueError, match="prior=True needs a module with a 'trainable' submodule.*Linear"):
        dist.p_create(sgd, None, True)
    with pytest.raises(KeyError, match="particle 42 does not exist"):
        dist.p_parameters(42)
    with pytest.raises(TypeError, match="p_wait takes PFutures"):
        dist.p_wait([1])
    with pytest.raises(TypeError, match="mk_module must be callable"):
        push.PusH(3)
    with pytest.raises(ValueError, match="device_type must be 'cpu' or 'cuda'"):
        push.PusH(torch.nn.Identity, device_type="tpu")
    # Nothing above left the distribution unusable.
    assert dist.particle_ids() == [pid]


def test_a_factory_that_is_not_a_module(dist):
    with push.PusH(lambda: "not a module") as d:
        with pytest.raises(TypeError, match="must return a torch.nn.Module, got str"):
            d.p_create(None)
        assert d.particle_ids() == []


def test_a_factory_that_raises():
    def boom():
        raise OSError("no weights file")

    with push.PusH(boom) as d:
        with pytest.raises(OSError, match="no weights file") as info:
            d.p_create(None)
        assert "making the module of a new particle" in info.value.__notes__[0]
        assert d.particle_ids() == []


def test_step_without_an_optimizer_computes_gradients_only(dist):
    # PusH's meaning: SVGD's particles have no optimizer; step gives them their gradients.
    def step(p, x):
        loss = p.step(torch.nn.functional.mse_loss, x, x[:, :1]).wait()
        return loss, [t.grad.clone() for t in p.module.parameters()]

    pid = dist.p_create(None, receive={"STEP": step})
    before = dist.p_parameters(pid)
    loss, grads = dist.p_launch(pid, "STEP", torch.ones(2, 3)).wait()
    assert loss.item() > 0 and all(g.abs().sum() > 0 for g in grads)
    assert all(torch.equal(a, b) for a, b in zip(before, dist.p_parameters(pid)))


def test_a_particle_kept_after_its_handler_returned(dist):
    kept = []
    pid = dist.p_create(None, receive={"KEEP": lambda p: kept.append(p), "ECHO": lambda p: 1})
    dist.p_launch(pid, "KEEP").wait()
    with pytest.raises(push.CancelledError, match=f"particle {pid}'s handler for 'KEEP' has ended"):
        kept[0].send(pid, "ECHO")
    with pytest.raises(push.CancelledError, match="forward can only be used while the handler runs"):
        kept[0].forward(torch.ones(1, 3))


def test_wait_timeout(dist):
    pid = dist.p_create(None, receive={"SLOW": lambda p: time.sleep(1.0)})
    f = dist.p_launch(pid, "SLOW")
    with pytest.raises(TimeoutError):
        f.wait(timeout=0.05)
    assert f.wait(timeout=30) is None


def test_a_closed_distribution(dist):
    pid = dist.p_create(None, receive={"ECHO": lambda p: 1})
    dist.close()
    dist.close()
    with pytest.raises(ValueError, match="closed"):
        dist.p_launch(pid, "ECHO")


def test_a_self_containing_argument_raises_recursion_error(dist):
    pid = dist.p_create(None, receive={"ECHO": lambda p, *a: a})
    loop = []
    loop.append(loop)
    with pytest.raises(RecursionError):
        dist.p_launch(pid, "ECHO", loop)
    assert dist.p_launch(pid, "ECHO", [[1]]).wait() == ([[1]],)


def test_p_create_inside_a_handler_is_refused(dist):
    pid = dist.p_create(None, receive={"MAKE": lambda p: dist.p_create(None)})
    with pytest.raises(ValueError, match="p_create cannot be called from inside a handler"):
        dist.p_launch(pid, "MAKE").wait()


def test_a_failing_optimizer_leaves_no_particle(dist):
    def bad_optim(params):
        raise RuntimeError("no such optimizer")

    with pytest.raises(RuntimeError, match="no such optimizer"):
        dist.p_create(bad_optim)
    assert dist.particle_ids() == []
    assert dist.p_create(sgd) == 1  # the failed particle's id was used up, nothing else


def test_close_from_inside_a_handler(dist):
    def close(p):
        dist.close()
        return "closed from a handler"

    pid = dist.p_create(None, receive={"CLOSE": close})
    f = dist.p_launch(pid, "CLOSE")
    try:
        assert f.wait(timeout=60) == "closed from a handler"
    except push.CancelledError:
        pass  # the runtime stopped before the result was delivered: also a clean end
    deadline = time.monotonic() + 30
    while not dist._core.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert dist._core.closed


def test_the_last_reference_dropped_in_a_handler():
    def start():
        d = push.PusH(lambda: torch.nn.Linear(2, 2))
        pid = d.p_create(None, receive={"WORK": lambda p: p.pid})
        return d.p_launch(pid, "WORK")  # d itself is dropped here; its handler still runs

    f = start()
    try:
        assert f.wait(timeout=60) == 0
    except push.CancelledError:
        pass


def test_close_cancels_a_handler_waiting_on_another():
    def outer(p):
        return p.send(p.other_particles()[0], "SLOW").wait()

    def slow(p):
        time.sleep(0.5)
        return 1

    d = push.PusH(lambda: torch.nn.Linear(2, 2))
    a = d.p_create(None, receive={"OUTER": outer})
    d.p_create(None, receive={"SLOW": slow})
    f = d.p_launch(a, "OUTER")
    time.sleep(0.2)
    start = time.monotonic()
    d.close()
    assert time.monotonic() - start < 30
    try:
        assert f.wait(timeout=30) == 1
    except (push.CancelledError, push.ParticleError):
        pass


def test_ctrl_c_during_p_wait_stops_cleanly(tmp_path):
    script = tmp_path / "ctrl_c.py"
    script.write_text(textwrap.dedent("""
        import sys, time, torch, push
        def slow(p):
            time.sleep(6)
            return 1
        with push.PusH(lambda: torch.nn.Linear(2, 2)) as d:
            pid = d.p_create(None, receive={"SLOW": slow})
            f = d.p_launch(pid, "SLOW")
            print("waiting", flush=True)
            try:
                d.p_wait([f])
            except KeyboardInterrupt:
                print("interrupted", flush=True)
        print("closed", flush=True)
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(0.5)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline().strip() == "interrupted"
        # Long before the handler's 6 s end: the wait itself stopped.
        assert time.monotonic() - sent < 4
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert out.split() == ["closed"]
    assert proc.returncode == 0


def test_a_model_left_open_at_exit_is_closed_before_the_interpreter_finalizes(tmp_path):
    # A push.bayes model still alive at exit used to be freed by the finalizing interpreter's
    # garbage collector; its lanes, freeing tensors Python also holds, then asked for the
    # GIL, and CPython ends such a thread mid-C++ frame: std::terminate (2 exits in 30 on
    # torch 2.15 before the fix). An atexit hook now closes every open model first.
    script = tmp_path / "open_model.py"
    script.write_text(
        "import torch\n"
        "from torch import nn\n"
        "import push.bayes as bayes\n"
        "make = lambda: nn.Sequential(nn.Linear(1, 8), nn.ReLU(), nn.Linear(8, 1))\n"
        "model = bayes.Ensemble(make, particles=4, batch_size=32).fit(torch.randn(64, 1), torch.randn(64, 1))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for _ in range(8):
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "terminate" not in done.stderr, done.stderr


def test_a_closed_model_says_so():
    model = push.bayes.Ensemble(lambda: torch.nn.Sequential(torch.nn.Linear(1, 1)), particles=2)
    with model:
        model.fit(torch.randn(8, 1), torch.randn(8, 1))
    with pytest.raises(ValueError, match="push.bayes.Ensemble: this model is closed"):
        model.predict(torch.randn(2, 1))


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_a_dropped_distribution_is_collected_and_its_threads_end():
    # The runtime held the distribution's bound factory method: a reference the garbage
    # collector cannot see, so a dropped distribution lived on with its lanes' threads.
    import gc
    import weakref

    d = push.PusH(lambda: torch.nn.Linear(2, 1))
    d.p_create(None)
    gone = weakref.ref(d)
    del d
    gc.collect()
    assert gone() is None
    before = _threads()
    for _ in range(10):
        d = push.PusH(lambda: torch.nn.Linear(2, 1))
        d.p_create(None)
        del d
        gc.collect()
    # Closed by a closer thread each (a real wait: the threads end on their own).
    deadline = time.monotonic() + 30
    while _threads() > before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _threads() <= before + 2


def test_a_cache_size_below_one_or_not_a_number_is_refused_by_name():
    for bad in (0.5, float("nan"), float("inf"), True, "2"):
        with pytest.raises(ValueError, match="cache_size must be a number >= 1"):
            push.PusH(lambda: torch.nn.Linear(2, 1), cache_size=bad)


def test_a_failing_handler_nobody_waits_for_is_raised_by_the_next_wait_and_by_close():
    # PusH's own training loops send without waiting; the handler's exception used to vanish.
    import threading

    release, started = threading.Event(), threading.Event()

    def boom(p, n):
        started.set()
        release.wait(30)  # fails only once the test has seen the sender's result
        raise ValueError(f"nobody waits for this one ({n})")

    def fire(p, to, n):
        p.send(to, "BOOM", n)  # the future is dropped here
        return "sent"

    d = push.PusH(lambda: torch.nn.Linear(2, 1))
    b = d.p_create(None, receive={"BOOM": boom})
    a = d.p_create(None, receive={"FIRE": fire})
    assert list(d.p_wait([d.p_launch(a, "FIRE", b, 1)]).values()) == ["sent"]
    release.set()
    deadline = time.monotonic() + 30
    with pytest.raises(ValueError, match=r"nobody waits for this one \(1\)") as info:
        while time.monotonic() < deadline:  # raised once the handler has failed
            d.p_wait([])
            time.sleep(0.01)
    assert any(f"particle {b}, message 'BOOM'" in note for note in info.value.__notes__)
    d.p_wait([])  # said once
    started.clear()
    assert d.p_launch(a, "FIRE", b, 2).wait() == "sent"
    assert started.wait(30)  # running: close lets it finish (one not yet started is cancelled)
    with pytest.raises(ValueError, match=r"nobody waits for this one \(2\)"):
        d.close()  # lets the running handler finish, then says what it raised


def _start_script(tmp_path, body):
    script = tmp_path / "exit.py"
    script.write_text(textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def test_a_handler_still_running_at_exit_is_waited_for_at_most_the_grace(tmp_path):
    proc = _start_script(tmp_path, """
        import threading, time, torch, push
        push.exit_grace = 1
        d = push.PusH(lambda: torch.nn.Linear(2, 1))
        running = threading.Event()  # exit once the handler runs (one not yet started is cancelled)
        d.p_launch(d.p_create(None, receive={"F": lambda p: (running.set(), time.sleep(1e9))}), "F")
        assert running.wait(60)
        print("exiting", flush=True)
    """)
    try:
        assert proc.stdout.readline().strip() == "exiting"
        start = time.monotonic()
        out, err = proc.communicate(timeout=60)
        assert time.monotonic() - start < 20  # the grace (1 s), not the handler's end
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert "still had a handler running at exit (push.exit_grace = 1 s passed)" in err, err


def test_a_second_ctrl_c_ends_the_exit_at_once(tmp_path):
    proc = _start_script(tmp_path, """
        import time, torch, push
        d = push.PusH(lambda: torch.nn.Linear(2, 1))
        f = d.p_launch(d.p_create(None, receive={"F": lambda p: time.sleep(1e9)}), "F")
        print("waiting", flush=True)
        d.p_wait([f])
    """)
    try:
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(0.5)  # real time: the wait has begun
        proc.send_signal(signal.SIGINT)  # the wait ends; the exit waits for the handler
        time.sleep(1)  # real time: the exit has begun waiting (its grace is 10 s)
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert time.monotonic() - start < 5
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert "(interrupted)" in err, err


def test_a_handler_exception_keeps_the_handlers_own_frames(dist):
    import traceback

    def deep_in_the_handler(x):
        raise ValueError(f"from deep ({x})")

    def handler(p, x):
        deep_in_the_handler(x)

    pid = dist.p_create(None, receive={"H": handler})
    with pytest.raises(ValueError, match=r"from deep \(3\)") as info:
        dist.p_wait([dist.p_launch(pid, "H", 3)])
    names = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert "handler" in names and "deep_in_the_handler" in names, names
