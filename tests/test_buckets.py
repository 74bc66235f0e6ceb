"""ddp_sync=buckets (tutorial_lib.buckets): the plan follows the model's parts and the size cap, each bucket's
all-reduce starts during the backward pass as soon as its gradients are ready (the first before the stem has a
gradient), and after finish() every gradient is the average, a view of its bucket. The two-rank equality with
one process is in test_ddp_correctness.py."""
import pytest
import torch
import torch.distributed as dist

from tutorial_lib import buckets, distributed, models
from tutorial_lib.config import ConfigError, TrainConfig


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield distributed.DistEnv(rank=0, world_size=1, launched=True, backend="gloo")
    dist.destroy_process_group()


def test_the_plan_runs_from_the_last_part_to_the_first_and_never_mixes_parts():
    net = models.build("resnet18", 10)
    plan = buckets.plan(net, cap_mb=4)
    owner = {id(p): name.split(".")[0] for name, p in net.named_parameters()}
    order = [owner[id(b[0])] for b in plan]
    assert order[0] == "fc" and order[-1] == "conv1", order
    assert [n for i, n in enumerate(order) if i == 0 or n != order[i - 1]] == \
        ["fc", "layer4", "layer3", "layer2", "layer1", "bn1", "conv1"], order
    for b in plan:
        assert len({owner[id(p)] for p in b}) == 1, "a bucket holds two parts"
        assert len(b) == 1 or sum(p.numel() * 4 for p in b) <= 4 * 2**20, "a bucket of several tensors over the cap"
    assert sorted(id(p) for b in plan for p in b) == sorted(id(p) for p in net.parameters())
    assert len(plan) > len(buckets.plan(net, cap_mb=1000)) == 7


def test_buckets_start_during_the_backward_pass_and_land_as_averages(one_rank, monkeypatch):
    torch.manual_seed(0)
    net = models.build("resnet18", 10)
    stem = net.conv1.weight
    seen = []  # at each bucket's start: did the stem (the last gradient of the backward pass) have one yet?
    real = distributed.start_average

    def spy(params, env, dtype=None):
        seen.append(stem.grad is not None)
        return real(params, env, dtype)
    monkeypatch.setattr(distributed, "start_average", spy)
    sync = buckets.GradBuckets(net, one_rank, cap_mb=4)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    torch.nn.functional.cross_entropy(net(x), y).backward()
    assert len(seen) == len(sync.buckets), "every bucket started during the backward pass"
    assert seen[0] is False and seen[-1] is True, seen
    expected = {n: p.grad.clone() for n, p in net.named_parameters()}
    sync.finish()
    for n, p in net.named_parameters():
        assert torch.equal(p.grad, expected[n]), n  # one rank: the average is the gradient itself
    flat = {p.grad.untyped_storage().data_ptr() for p in net.parameters()}
    assert len(flat) == len(sync.buckets), "each gradient is a view of its bucket's buffer"


def test_a_parameter_without_gradient_still_lets_every_bucket_finish(one_rank):
    net = models.build("mnist_cnn", 10)
    net.classifier[1].weight.requires_grad_(True)
    sync = buckets.GradBuckets(net, one_rank, cap_mb=25)
    net.features(torch.randn(2, 1, 28, 28)).sum().backward()  # the classifier gets no gradient
    sync.finish()
    assert torch.count_nonzero(net.classifier[1].weight.grad) == 0
    assert net.features[0].weight.grad.abs().sum() > 0


def test_compile_parts_keeps_the_state_dict_names():
    net = models.build("resnet18", 10)
    names = list(net.state_dict())
    buckets.compile_parts(net, "default")
    assert list(net.state_dict()) == names


def test_buckets_need_the_whole_step_graph():
    with pytest.raises(ConfigError, match="ddp_sync=buckets .* needs cuda_graph=true"):
        TrainConfig(ddp_sync="buckets").validate()
    TrainConfig(ddp_sync="buckets", cuda_graph=True).validate()


def test_flatten_keeps_every_layout_and_views_of_gives_each_tensor_back():
    conv = torch.randn(8, 3, 5, 5).to(memory_format=torch.channels_last)
    bias, sliced = torch.randn(8), torch.randn(6, 4)[:, ::2]  # a tensor with gaps comes back contiguous
    flat = distributed.flatten([conv, bias, sliced])
    assert flat.shape == (conv.numel() + bias.numel() + sliced.numel(),)
    back = distributed.views_of(flat, [conv, bias, sliced])
    for t, b in zip((conv, bias, sliced), back):
        assert torch.equal(t, b)
    assert back[0].is_contiguous(memory_format=torch.channels_last) and back[0].stride() == conv.stride()
    assert torch.equal(flat[:conv.numel()], conv.permute(0, 2, 3, 1).reshape(-1))  # in the order it lies in memory
    assert back[2].is_contiguous() and back[2].untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
