"""cuda_graph=true (tutorial_lib.stepgraph): the whole step recorded once and replayed. A CPU has no CUDA graphs,
so here the same step runs unrecorded; these tests hold what must not change when it is recorded on a GPU (the
losses and parameters of a plain run, the learning-rate schedule through a tensor, the bench's rewind), and the
combinations a graph can't hold are refused with the fix. scripts/gpu/ddp_probe.sh checks it on GPUs."""
import pytest
import torch

import tutorial_lib as tl
from tutorial_lib import bench, stepgraph
from tutorial_lib.config import ConfigError

TINY = dict(dataset="shapes", model="resnet18_imagenet", train_size=64, val_size=16, batch_size=8, steps=6,
            timing_warmup=1, log_every=3, num_workers=0, device="cpu", eval=False, tensorboard=False,
            progress=False, resume=False, optimizer_impl="fused", warmup_steps=2)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_a_graphed_run_trains_exactly_as_a_plain_run(tmp_path, one_thread, optimizer):
    plain = tl.train(tl.TrainConfig(**TINY, optimizer=optimizer, out_dir=str(tmp_path / "plain")))
    graphed = tl.train(tl.TrainConfig(**TINY, optimizer=optimizer, cuda_graph=True, out_dir=str(tmp_path / "graph")))
    assert graphed.loss == plain.loss
    assert graphed.param_checksums == plain.param_checksums


def test_the_learning_rate_lives_in_a_tensor_that_the_schedule_fills(tmp_path, one_thread):
    cfg = tl.TrainConfig(**TINY, cuda_graph=True, lr_schedule="cosine", out_dir=str(tmp_path / "lr"))
    with tl.engine.prepared_run(cfg) as run:
        lr = run.opt.param_groups[0]["lr"]
        assert isinstance(lr, torch.Tensor) and isinstance(run.opt.param_groups[0]["initial_lr"], float)
        seen = []
        batches = run.batches()
        for _ in range(4):
            run.train_step(*next(batches))
            seen.append(lr.item())
        assert run.opt.param_groups[0]["lr"] is lr  # filled in place: a recorded step keeps reading it
        expected = [cfg.lr * tl.engine.lr_lambda(cfg, run.total_steps)(s) for s in range(1, 5)]
        assert seen == pytest.approx(expected)


def test_the_bench_rewinds_the_schedule_into_the_same_tensor(tmp_path, one_thread):
    cfg = tl.TrainConfig(**TINY, cuda_graph=True, out_dir=str(tmp_path / "bench"))
    with tl.engine.prepared_run(cfg.replace(steps=8)) as run:
        lr = run.opt.param_groups[0]["lr"]
        pool = [next(run.batches())]
        bench.measure_synthetic(run, bench.clock(run, 0), 3, pool)
        assert run.opt.param_groups[0]["lr"] is lr and lr.item() == pytest.approx(run.sched.get_last_lr()[0])


@pytest.mark.parametrize("change, fix", [
    (dict(precision="fp16"), "precision=bf16"),
    (dict(compile=True, compile_mode="reduce-overhead"), "compile_mode=default"),
    (dict(parallel="dp"), "parallel=ddp"),
    (dict(grad_accum_steps=2), "grad_accum_steps=1"),
    (dict(optimizer_impl="foreach"), "optimizer_impl=fused"),
    (dict(sync_batchnorm=True), "sync_batchnorm=false"),
    (dict(ddp_sync="hooks"), "ddp_sync=auto"),
])
def test_what_a_graph_cannot_hold_is_refused_with_the_fix(change, fix):
    with pytest.raises(ConfigError, match=f"cuda_graph=true does not work with .*; use {fix}, or cuda_graph=false"):
        tl.TrainConfig(cuda_graph=True, **change)


def test_ddp_sync_follows_the_graph_and_never_syncs_without_grad_sync():
    assert tl.TrainConfig(parallel="ddp", cuda_graph=True).sync_mode() == "flat"
    assert tl.TrainConfig(parallel="ddp", compile=True, compile_mode="reduce-overhead").sync_mode() == "flat"
    assert tl.TrainConfig(parallel="ddp").sync_mode() == "hooks"
    assert tl.TrainConfig(parallel="ddp", cuda_graph=True, grad_sync=False).sync_mode() == "none"


def test_on_a_cpu_the_step_runs_unrecorded_and_zeroes_its_gradients():
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.5, fused=True)
    stepgraph.tensor_lr(opt)

    def body(x, y):
        loss = (w * x).sum()
        loss.backward()
        opt.step()
        return loss.detach()
    step = stepgraph.GraphedStep(body, opt, torch.device("cpu"))
    for _ in range(2):
        step(torch.ones(3), None)
    assert not step.recorded and torch.allclose(w, torch.zeros(3))  # 1 - 0.5 - 0.5: each step saw its own gradient
