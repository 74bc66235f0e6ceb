"""The DDP knobs of notebook 05 as config keys: bad values are refused with the fix in the message, and
profile_ranks picks the ranks that record."""
import pytest

from tutorial_lib.config import ConfigError, TrainConfig


@pytest.mark.parametrize("changes, message", [
    (dict(profile_ranks="rank0"), "profile_ranks='rank0' is not 'all' or a comma list of ranks"),
    (dict(profile_ranks="-1"), "profile_ranks='-1'"),
    (dict(grad_accum_steps=0), "grad_accum_steps=0 must be a positive integer"),
    (dict(ddp_sync="sometimes"), "ddp_sync='sometimes' is not one of auto, hooks, flat"),
    (dict(ddp_compile="late"), "ddp_compile='late' is not one of split, whole, inner"),
])
def test_bad_values_are_refused(changes, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TrainConfig(**changes)


def test_sync_batchnorm_needs_ddp_on_gpus():
    with pytest.raises(ConfigError, match="sync_batchnorm=true needs parallel=ddp on CUDA GPUs"):
        TrainConfig(sync_batchnorm=True, parallel="ddp").check_runtime("cpu", 2, True)


def test_profile_ranks():
    assert TrainConfig().profile_rank_set() is None
    assert TrainConfig(profile_ranks="0,3").profile_rank_set() == {0, 3}


def test_flat_gradient_sync_is_chosen_for_cuda_graphs_only():
    assert TrainConfig(compile=True, compile_mode="reduce-overhead").flat_grad_sync()
    assert not TrainConfig(compile=True).flat_grad_sync()
    assert not TrainConfig(compile=True, compile_mode="reduce-overhead", ddp_sync="hooks").flat_grad_sync()
    assert TrainConfig(ddp_sync="flat").flat_grad_sync()


def test_a_rank_outside_profile_ranks_records_nothing(tmp_path):
    from tutorial_lib import distributed, profiling

    cfg = TrainConfig(profile=True, profile_ranks="0", out_dir=str(tmp_path), steps=10)
    with profiling.profiler(cfg, distributed.DistEnv(rank=1)) as prof:
        assert isinstance(prof, profiling._NoProfiler)
    with profiling.profiler(cfg, distributed.DistEnv(rank=0)) as prof:
        assert not isinstance(prof, profiling._NoProfiler)
