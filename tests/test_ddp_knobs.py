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


def test_the_gradient_sync_is_decided_once_from_the_config():
    ddp = dict(parallel="ddp")
    assert TrainConfig(**ddp, compile=True, compile_mode="reduce-overhead").sync_mode() == "flat"
    assert TrainConfig(**ddp, compile=True).sync_mode() == "hooks"
    assert TrainConfig(**ddp, compile=True, compile_mode="reduce-overhead", ddp_sync="hooks").sync_mode() == "hooks"
    assert TrainConfig(**ddp, ddp_sync="flat").sync_mode() == "flat"
    assert TrainConfig(**ddp, cuda_graph=True, ddp_sync="buckets").sync_mode() == "buckets"
    assert TrainConfig(**ddp, ddp_sync="flat", grad_sync=False).sync_mode() == "none"
    assert TrainConfig(ddp_sync="flat").sync_mode() == TrainConfig(parallel="dp").sync_mode() == "none"


def test_cudnn_benchmark_force_is_a_value_the_command_line_and_the_engine_understand():
    """The DataParallel trap of notebook 05 is a knob (cudnn_benchmark=force), not a patch of the engine."""
    import torch

    from tutorial_lib import config
    from tutorial_lib.precision import backend_flags, set_cudnn_benchmark

    cfg = config.load(overrides=["cudnn_benchmark=force", "parallel=dp"])
    assert cfg.cudnn_benchmark == "force" and "cudnn_benchmark=force" in cfg.to_overrides()
    assert config.load(overrides=["cudnn_benchmark=off"]).cudnn_benchmark is False
    with backend_flags():
        for value, parallel, on in ((True, "dp", False), ("force", "dp", True), (True, "none", True),
                                    (False, "none", False), ("force", "none", True)):
            set_cudnn_benchmark(TrainConfig(cudnn_benchmark=value, parallel=parallel))
            assert torch.backends.cudnn.benchmark is on, (value, parallel)
    with pytest.raises(ConfigError, match="cudnn_benchmark='always' must be true, false or force"):
        config.load(overrides=["cudnn_benchmark=always"])


def test_a_rank_outside_profile_ranks_records_nothing(tmp_path):
    from tutorial_lib import distributed, profiling

    cfg = TrainConfig(profile=True, profile_ranks="0", out_dir=str(tmp_path), steps=10)
    with profiling.profiler(cfg, distributed.DistEnv(rank=1)) as prof:
        assert isinstance(prof, profiling._NoProfiler)
    with profiling.profiler(cfg, distributed.DistEnv(rank=0)) as prof:
        assert not isinstance(prof, profiling._NoProfiler)
