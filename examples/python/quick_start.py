"""PusH's particle API: particles that train and talk. Runs on PusH with `import push`
meaning PusH; on push, unchanged (see docs/python.md)."""
import torch

import push


def main(particle, x, y, epochs):
    # Train this particle, then ask every other one to train on the same data and report.
    for _ in range(epochs):
        loss = particle.step(torch.nn.functional.mse_loss, x, y).wait()
    others = [particle.send(pid, "TRAIN", x, y, epochs) for pid in particle.other_particles()]
    return [loss.item()] + particle.wait(others)


def train(particle, x, y, epochs):
    for _ in range(epochs):
        loss = particle.step(torch.nn.functional.mse_loss, x, y).wait()
    return loss.item()


if __name__ == "__main__":
    torch.manual_seed(0)
    x = torch.randn(128, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    with push.PusH(torch.nn.Linear, 4, 1) as push_dist:
        mk_optim = lambda params: torch.optim.SGD(params, lr=0.05)  # noqa: E731
        pids = [push_dist.p_create(mk_optim, device=0, receive={"MAIN": main, "TRAIN": train})]
        pids += [push_dist.p_create(mk_optim, device=0, receive={"TRAIN": train}) for _ in range(3)]
        results = push_dist.p_wait([push_dist.p_launch(pids[0], "MAIN", x, y, 200)])
        losses = list(results.values())[0]
        print("final losses:", " ".join(f"{l:.2e}" for l in losses))
        assert all(l < 1e-3 for l in losses), losses
