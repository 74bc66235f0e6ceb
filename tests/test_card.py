"""tl.card and `python -m tutorial_lib card` on CPU: a transformer of this test's own (written to a file, with
scaled_dot_product_attention) through the CLI, three torchvision models (weights=None, tiny inputs) through
tl.card, and every input that breaks the card's rules ending in one line that names the fix."""
import functools
import json
import os
import re
import subprocess
import textwrap

import pytest
import torch
import torchvision
from torch import nn

import tutorial_lib as tl
from tutorial_lib import __main__ as cli, jobs
from tutorial_lib.config import UserError
from tutorial_lib.lessons import card as card_module, card_input, card_report, card_verdict

TRANSFORMER = textwrap.dedent('''
    import torch
    from torch import nn
    import torch.nn.functional as F

    VOCAB, WIDTH, HEADS, LAYERS, SEQ, BATCH = 50, 32, 2, 2, 16, 4


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
            self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
            self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(self.ln2(x))


    class TinyGPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Parameter(torch.zeros(SEQ, WIDTH))
            self.blocks = nn.Sequential(*[Block() for _ in range(LAYERS)])
            self.head = nn.Linear(WIDTH, VOCAB)

        def forward(self, idx):
            return self.head(self.blocks(self.emb(idx) + self.pos[: idx.shape[1]]))


    def make_model():
        return TinyGPT()


    def batch():
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
        return tokens[:, :-1], tokens[:, 1:]


    def as_dict():
        return {"logits": TinyGPT()}


    class DictOut(TinyGPT):
        def forward(self, idx):
            return {"logits": super().forward(idx)}


    def dict_loss(output, target):
        return F.cross_entropy(output["logits"].flatten(0, 1), target.flatten())
''')


@pytest.fixture(scope="module")
def gpt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("own") / "tiny_gpt.py"
    path.write_text(TRANSFORMER)
    return path


def images(n=4, size=32, classes=10):
    def batch():
        return torch.rand(n, 3, size, size), torch.randint(0, classes, (n,))
    return batch


# ---------------------------------------------------------------------------------------- the transformer, CLI
def test_the_cli_cards_a_transformer_of_its_own_file(gpt_file, tmp_path, capsys):
    out, jobs_dir = tmp_path / "card", tmp_path / "jobs"
    code = cli.main(["card", f"{gpt_file}:make_model", f"out={out}", f"jobs_dir={jobs_dir}", "--small"])
    printed = capsys.readouterr().out
    assert code == 0
    rec = json.loads((out / "card.json").read_text())
    rows = {r["rung"]: r for r in rec["rows"]}
    assert rows["fp32"]["img_s"] > 0 and rows["bf16"]["img_s"] > 0 and rows["fused_adamw"]["img_s"] > 0
    assert "no 2-d convolution" in rows["channels_last"]["skipped"]  # tokens in, no convolution
    assert rows["tf32"]["skipped"] and rows["step_graph"]["skipped"] and "compile_on_cpu" in rows["compile"]["skipped"]
    assert rec["probe"]["input"] == "(4, 16) int64" and rec["probe"]["output"] == "(4, 16, 50)"
    # FLOPs counted by torch: about 6 x the linear layers' weights x tokens, plus attention's, per sequence
    model = (gpt := _load(gpt_file)).make_model()
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    assert 1.0 < rec["probe"]["flops_per_sample"] / (6 * linear * gpt.SEQ) < 1.5
    assert set(rec["bench"]["figures"]) == {"io", "synthetic", "full"} and rec["bench"]["bound"]
    assert [r["gpus"] for r in rec["ddp"]["rows"]] == [2, 4, 8]
    assert all(0 < r["efficiency_exposed"] <= r["efficiency_hidden"] <= 1 for r in rec["ddp"]["rows"])
    assert rec["ddp"]["bandwidth"]["backend"] == "gloo" and rec["ddp"]["bandwidth"]["bus_gb_s"] > 0
    assert rec["ddp"]["measured"]["why"].startswith("not measured: this node has 0 GPUs")  # auto: a CPU measures none
    assert rec["memory"]["largest_batch"] is None and "n/a on a CPU" in rec["memory"]["why"]
    assert rec["recommended"]["rung"] in rows and not rows[rec["recommended"]["rung"]]["skipped"]
    page = (out / "card.md").read_text()
    assert "| fp32 |" in page and "samples/s" in page and page.strip() in printed
    assert 2 <= rec["probe"]["flops_per_sample"] / rec["probe"]["flops_forward"] <= 4 and "- **DDP**: " in page
    assert "MFU is n/a: the workbook has no datasheet peak for CPU" in page  # the peaks are named, or their absence
    job = jobs_dir / "card_tinygpt.sbatch"
    assert rec["job"]["path"] == jobs.shown_path(job) and "--train" in job.read_text()
    assert f"sbatch {jobs.shown_path(job)}" in job.read_text()  # its header names where it is
    assert jobs.rerender(job) == job.read_text()  # renders again to the same file: a valid render record
    assert subprocess.run(["bash", "-n", str(job)]).returncode == 0


def test_the_job_s_command_trains_the_model(gpt_file, tmp_path, capsys):
    """What the card's job runs: the model trained by the engine at a configuration (result.json)."""
    out = tmp_path / "train"
    code = cli.main(["card", f"{gpt_file}:make_model", "--train", "steps=6", "timing_warmup=1", "precision=bf16",
                     f"out_dir={out}", "--batch", f"{gpt_file}:batch"])
    assert code == 0
    result = tl.load_result(out)
    assert result.steps == 6 and result.config["precision"] == "bf16" and result.flops_per_image > 0


def test_ddp_measured_beside_the_prediction(gpt_file, tmp_path):
    """ddp_gpus=2: the recommendation trained by the card's command line on one process and as DDP on two (gloo
    here; GPUs on a node with several), the weak-scaling efficiency beside the predicted range."""
    out = tmp_path / "card"
    result = tl.card(f"{gpt_file}:make_model", f"{gpt_file}:batch", small=True, quiet=True, rungs="fp32",
                     ddp_gpus=2, out=str(out))
    m = result.ddp["measured"]
    assert m["why"] is None and m["gpus"] == 2 and m["unit"] == "CPU processes (gloo)"
    records = json.loads((out / "ddp" / "cases.json").read_text())
    one, two = records["one_gpu"]["result"], records["ddp_2"]["result"]
    assert one["world_size"] == 1 and one["config"]["parallel"] == "none"
    assert two["world_size"] == 2 and two["config"]["parallel"] == "ddp" and two["global_batch"] == 2 * one["global_batch"]
    assert m["efficiency"] == pytest.approx(two["throughput_img_s"] / (2 * one["throughput_img_s"]))
    row = dict(result.summary_rows())["DDP efficiency measured"]
    two_row = next(x for x in result.ddp["rows"] if x["gpus"] == 2)  # the prediction for the same count
    assert row.startswith(f"{m['efficiency']:.2f} on 2 CPU processes")
    assert f"; predicted {card_report._ends(two_row)}" in row  # one figure where both ends print the same
    below = round(m["efficiency"], 2) < round(two_row["efficiency_exposed"], 2)
    assert ("DDP measured below the predicted range" in result.markdown()) == below  # a note under the tables
    seconds = {part: s for part, s in re.findall(r"(the rungs|measuring DDP) ([\d.]+) s", result.markdown())}
    assert 0 < m["wall_s"] < result.wall_s and float(seconds["measuring DDP"]) == pytest.approx(m["wall_s"], abs=0.51)
    rungs = sum(r.get("wall_s") or 0 for r in result.rows)  # where the seconds went, each part the card timed
    assert 0 < rungs + m["wall_s"] < result.wall_s and float(seconds["the rungs"]) == pytest.approx(rungs, abs=0.51)
    # DDP in this one process (rank 0 of 1): the prediction adds the all-reduce to its step, not to the plain one
    alone = result.ddp["one_process"]
    ran = tl.load_result(out / "runs" / "ddp_one_process")
    assert ran.world_size == 1 and ran.config["parallel"] == "ddp" and alone["why"] is None
    assert alone["factor"] == pytest.approx(alone["row"]["img_s"] / result.recommended["row"]["img_s"])
    ddp_step, plain = max(alone["step_ms"], result.ddp["step_ms"]), result.ddp["step_ms"]
    assert two_row["efficiency_exposed"] == pytest.approx(plain / (ddp_step + two_row["allreduce_ms"]))
    assert dict(result.summary_rows())["DDP in one process (its own cost)"].startswith(f"x{alone['factor']:.2f} of")
    assert not {"RANK", "WORLD_SIZE", "MASTER_PORT"} & set(os.environ)  # torchrun's variables gone again
    given_as_objects = tl.card(_load(gpt_file).make_model, _load(gpt_file).batch, small=True, quiet=True,
                               rungs="fp32", ddp_gpus=2, out=str(tmp_path / "objects"))
    assert "name them as MODULE:FUNCTION" in given_as_objects.ddp["measured"]["why"]
    for bad in ("1", "two", "-2"):
        assert f"ddp_gpus={bad!r} must be auto, 0" in _error(nn.Linear(4, 2), images(), ddp_gpus=bad)


def _load(path):
    from tutorial_lib import ownmodel

    return ownmodel._import(str(path), "model")


# ---------------------------------------------------------------------------------------- torchvision
def test_resnet18_gets_every_rung_a_cpu_runs(tmp_path):
    factory = functools.partial(torchvision.models.resnet18, weights=None, num_classes=10)
    c = tl.card(factory, images(), quiet=True, out=str(tmp_path / "r18"), jobs_dir=str(tmp_path))
    rows = {r["rung"]: r for r in c.rows}
    for rung in ("fp32", "bf16", "channels_last", "fused_adamw"):
        assert not rows[rung]["skipped"] and rows[rung]["img_s"] > 0, rung
    assert c.name == "resnet18" and c.probe["convolutions"] and c.probe["params"] == 11_181_642
    assert "the model or the batch was given as an object" in c.job["why"]  # a partial has no MODULE:FUNCTION
    assert c.verdicts["channels_last"].split(", ")[1].startswith(("faster", "slower", "within noise", "not settled"))
    assert (tmp_path / "r18" / "card.md").is_file() and c.rung_table() in c.markdown()


def test_mobilenet_from_a_dataset(tmp_path):
    data = torch.utils.data.TensorDataset(torch.rand(24, 3, 32, 32), torch.randint(0, 10, (24,)))
    factory = functools.partial(torchvision.models.mobilenet_v3_small, weights=None, num_classes=10)
    c = tl.card(factory, data, quiet=True, batch_size=4, num_workers=0, rungs="fp32,channels_last",
                out=str(tmp_path / "m"))
    rows = {r["rung"]: r for r in c.rows}
    assert c.probe["batch"] == 4 and "TensorDataset in a DataLoader" in c.probe["source"]
    assert not rows["channels_last"]["skipped"] and rows["bf16"]["skipped"].startswith("left out (rungs=...)")
    assert 2 <= c.probe["flops_per_sample"] / c.probe["flops_forward"] <= 4 and "per group" in c.probe["flops_how"]


def test_a_rung_asked_for_alone_is_the_ladders_rung():
    """rungs=step_graph measures the configuration the whole ladder's step_graph row has (bf16, fused, compiled,
    graphed), not one change on top of fp32: the rungs left out keep their changes (notebook 07 measures the
    recommended rung again at twice the batch this way)."""
    from tutorial_lib.config import TrainConfig
    from tutorial_lib.lessons import card

    cfg, probe = TrainConfig(out_dir="runs/x"), {"device_type": "cuda", "convolutions": True}
    whole = {r.name: (c, why) for r, c, why in card.rung_plan(cfg, probe, None, False)}
    alone = {r.name: (c, why) for r, c, why in card.rung_plan(cfg, probe, ["step_graph"], False)}
    assert alone["step_graph"] == whole["step_graph"] and whole["step_graph"][1] is None
    assert alone["step_graph"][0].cuda_graph and alone["step_graph"][0].precision == "bf16"
    assert alone["bf16"][1].startswith("left out (rungs=...)") and alone["fp32"][1] is None


def test_a_vision_transformer_of_torchvision(tmp_path):
    vit = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=1, num_heads=2, hidden_dim=32,
                                               mlp_dim=64, num_classes=10)
    c = tl.card(vit, images(), quiet=True, rungs="fp32,bf16", out=str(tmp_path / "v"))
    assert c.name == "visiontransformer" and c.probe["flops_per_sample"] > 0
    assert {r["rung"] for r in c.rows if not r["skipped"]} == {"fp32", "bf16"}


# ---------------------------------------------------------------------------------------- bad input
def _error(model, batch, loss=None, **kw):
    with pytest.raises(UserError) as e:
        tl.card(model, batch, loss, quiet=True, **kw)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_a_model_without_parameters():
    assert "no parameters to train" in _error(nn.ReLU, images())


def test_a_batch_of_several_inputs():
    msg = _error(nn.Linear(4, 2), lambda: (torch.rand(2, 4), torch.rand(2, 4), torch.zeros(2, dtype=torch.long)))
    assert "several inputs" in msg and "return (input, target)" in msg


def test_a_dict_batch():
    msg = _error(nn.Linear(4, 2), lambda: {"x": torch.rand(2, 4), "y": torch.zeros(2, dtype=torch.long)})
    assert "is a dict (keys 'x', 'y')" in msg and "(input, target)" in msg


def test_a_batch_without_a_target():
    assert "(tokens[:, :-1], tokens[:, 1:])" in _error(nn.Linear(4, 2), lambda: torch.rand(2, 4))


def test_a_model_returning_a_dict_needs_a_loss(gpt_file):
    msg = _error(f"{gpt_file}:DictOut", f"{gpt_file}:batch")
    assert "returned a dict (keys 'logits')" in msg and "--loss MODULE:FUNCTION" in msg
    probe = card_module.probe_model(*_parts(f"{gpt_file}:DictOut", f"{gpt_file}:batch", f"{gpt_file}:dict_loss"))
    assert probe["output"] == "dict" and probe["flops_per_sample"] > 0  # with a loss of yours it trains
    assert 2 <= probe["flops_per_sample"] / probe["flops_forward"] <= 4  # the loss of yours counted in the forward


def _parts(model, batch, loss):
    parts, _ = card_module.user_parts(model, batch, loss)
    return parts, card_module.split_overrides({})[1]


def test_a_model_returning_a_tuple():
    class Pair(nn.Linear):
        def forward(self, x):
            return super().forward(x), x
    assert "returned a tuple of 2" in _error(Pair(4, 2), lambda: (torch.rand(2, 4), torch.zeros(2, dtype=torch.long)))


def test_variable_shapes():
    lengths = iter([8, 8, 5, 8])
    batch = lambda: (torch.rand(2, next(lengths), 4), torch.rand(2, 1, 2))  # noqa: E731
    msg = _error(nn.Linear(4, 2), batch)  # the first call shows the card what the function returns
    assert "batch 1 has input (2, 5, 4) and target (2, 1, 2), the first batch had (2, 8, 4)" in msg
    assert "pad to one length" in msg


def test_targets_that_fit_no_default_loss_ask_for_one():
    msg = _error(nn.Linear(4, 3), lambda: (torch.rand(2, 4), torch.rand(2, 5)))
    assert "output (2, 3) and float target (2, 5) fit no default loss" in msg and "--loss" in msg


def test_the_probe_runs_with_the_autotuner_the_rungs_use():
    """PyTorch keeps the algorithm each convolution first ran with (whatever cudnn.benchmark says later), so the
    probe's step, the model's first, runs with the autotuner as the rungs will; the flag is restored after."""
    seen = []

    class Spy(nn.Linear):
        def forward(self, x):
            seen.append(torch.backends.cudnn.benchmark)
            return super().forward(x)
    before = torch.backends.cudnn.benchmark
    parts, cfg = _parts(Spy(4, 2), lambda: (torch.rand(2, 4), torch.zeros(2, dtype=torch.long)), None)
    card_module.probe_model(parts, cfg)
    assert seen == [True] and torch.backends.cudnn.benchmark == before
    card_module.probe_model(parts, cfg.replace(cudnn_benchmark=False))
    assert seen == [True, False]


def test_integer_inputs_are_fed_as_they_are(gpt_file):
    """Tokens stay integers: the embedding gets them as the batch holds them (no normalising, no cast)."""
    parts, cfg = _parts(f"{gpt_file}:make_model", f"{gpt_file}:batch", None)
    assert card_module.probe_model(parts, cfg)["input"].endswith("int64")


def test_bad_names_and_keys(gpt_file, capsys):
    assert "is not MODULE:FUNCTION" in _error("my_model", images())
    assert "no file 'nowhere.py'" in _error("nowhere.py:make", images())
    assert "has no 'nothing'" in _error(f"{gpt_file}:nothing", images())
    assert "no rung 'warp'" in _error(nn.Linear(4, 2), images(), rungs="fp32,warp")
    assert "unknown key 'precison'" in _error(nn.Linear(4, 2), images(), precison="bf16")
    assert cli.main(["card", f"{gpt_file}:make_model", "--batch", f"{gpt_file}:as_dict"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "is a dict" in err


def test_the_cli_names_the_card_s_own_keys():
    assert set(cli.CARD_KEYS) == set(card_module.CARD_KEYS)


def test_the_examples_at_small_size(monkeypatch):
    """The models and batches of the GPU commands and notebook 07, at the small size: they fit the card's rules."""
    from tutorial_lib.lessons import card_examples as ex

    monkeypatch.setenv("WORKBOOK_SIZE", "small")
    probe = card_module.probe_model(*_parts("tutorial_lib.lessons.card_examples:gpt",
                                            "tutorial_lib.lessons.card_examples:tokens", None))
    s = ex.GPT_SMALL
    assert probe["output"] == f"({s.batch}, {s.seq}, {s.vocab})" and probe["flops_per_sample"] > 0
    x, y = ex.images()
    assert tuple(x.shape) == (ex.IMAGES_SMALL[1], 3, ex.IMAGES_SMALL[0], ex.IMAGES_SMALL[0]) and y.max() < 1000
    assert ex.tokens()[0] is not ex.tokens()[0]  # a pool of distinct batches, not one reused


def test_the_largest_batch_search():
    """Doubling, then halving the gap to within an eighth; the cap stops it (the GPU's out-of-memory is a None)."""
    tried = []

    def peak(k, limit=37):
        tried.append(k)
        return 1000 * k if k <= limit else None
    good, bad = card_module.search_batch(peak, 8, 4096)
    assert good <= 37 * 8 < bad and bad - good <= good // 8 + 8 and tried[:6] == [2, 4, 8, 16, 32, 64]
    assert card_module.search_batch(lambda k: 1, 8, 64) == (64, None)
    assert card_module.search_batch(lambda k: 1, 8, 80) == (80, None)  # the cap itself is tried
    assert card_module.search_batch(lambda k: None, 8, 4096) == (8, 16)


@pytest.mark.parametrize("limit", [37, 200, 511])
def test_the_largest_batch_search_predicts_from_the_memory_it_may_use(limit):
    """With a budget the line through the peaks at k = 1 and 2 predicts the largest k: a step costs 100 + 10 k
    bytes and the budget holds exactly `limit` of them, so the prediction (with its margin) fits, one eighth more
    does not, and the search ends within an eighth after a handful of batch sizes, not one per doubling."""
    tried = []

    def peak(k):
        tried.append(k)
        return 100 + 10 * k if k <= limit else None
    good, bad = card_module.search_batch(peak, 8, 4096, budget=100 + 10 * limit)
    assert good <= limit * 8 and (bad is None or (limit * 8 < bad and bad - good <= good // 8 + 8))
    assert tried[:2] == [1, 2] and len(tried) <= 6, tried
    predicted, tried[:] = list(tried), []
    card_module.search_batch(peak, 8, 4096)  # without a budget: doubling
    assert len(predicted) < len(tried), (predicted, tried)


def test_a_prediction_that_misses_falls_back_to_halving_the_gap():
    """Memory that grows faster than the line through k = 1 and 2 (fragmentation, a workspace): the predicted k does
    not fit, and the search halves the gap down to the largest that does."""
    def peak(k):
        return 100 + 10 * k if k <= 20 else None
    good, bad = card_module.search_batch(peak, 8, 4096, budget=100 + 10 * 100)
    assert good <= 20 * 8 < bad and bad - good <= good // 8 + 8


def test_the_bound_keeps_the_bench_s_first_line_without_its_advice():
    """The card's rungs measure each change, so the bench's generic advice after its bound is left out."""
    from tutorial_lib.lessons import card_report

    verdict = "compute-bound: FULL 380 ≈ SYNTHETIC 380 < IO 208,998 img/s\ncompute in bf16: x (notebook 04)"
    assert card_report._bound_only(verdict) == ("compute-bound: FULL 380 ≈ SYNTHETIC 380 < IO 208,998 samples/s; the "
                                                "rungs below measure what each change buys")


def test_the_ddp_prediction_adds_the_all_reduce_to_ddps_own_step():
    """A ring all-reduce of 2 GB on 2 ranks at 100 GB/s takes 20 ms. On a 30 ms step with no DDP cost it hides
    behind the backward pass (20 ms of it) or costs 30/50; with DDP's own step at 40 ms: 30/40 and 30/60."""
    from tutorial_lib.lessons import allreduce

    assert allreduce.allreduce_ms(2e9, 2, 100) == pytest.approx(20)
    plain, = allreduce.predict(30, 2e9, 100, gpus=(2,))
    assert (plain["efficiency_hidden"], plain["efficiency_exposed"]) == pytest.approx((1.0, 0.6))
    ddp, = allreduce.predict(30, 2e9, 100, gpus=(2,), ddp_step_ms=40)
    assert (ddp["efficiency_hidden"], ddp["efficiency_exposed"]) == pytest.approx((0.75, 0.5))


def test_ddp_in_one_process_says_why_when_it_is_not_measured(monkeypatch):
    from tutorial_lib.lessons import card_ddp

    rec = {"config": tl.load(None, {"out_dir": "runs/x/fp32"}), "row": {"img_s": 10.0, "batch": 4}}
    failed = card_ddp.one_process(lambda cfg: {"skipped": f"failed: {cfg.parallel} {cfg.out_dir}"}, rec)
    assert failed["why"] == "failed: ddp runs/x/ddp_one_process"  # the rung's row says why; it ran as DDP
    assert card_ddp.card_report.one_process_line(failed) == failed["why"]  # the notes say DDP's cost is left out
    assert card_ddp.predicted_step_ms(failed, 30.0) is None
    monkeypatch.setenv("RANK", "1")
    assert card_ddp.one_process(lambda cfg: pytest.fail("ran"), rec)["why"].startswith(
        "not measured: this process is already one rank")


def test_the_card_says_where_its_seconds_went():
    from types import SimpleNamespace

    from tutorial_lib.lessons.card_report import Card

    gpu = SimpleNamespace(rows=[{"wall_s": 100.4}, {"wall_s": None}, {"wall_s": 20.0}], memory={"search_s": 9.4},
                          ddp={"measured": {"wall_s": 80.2}})
    assert Card.phases(gpu) == ": the rungs 120 s, the largest-batch search 9.4 s, measuring DDP 80 s"
    cpu = SimpleNamespace(rows=[{"wall_s": 2.0}], memory={"largest_batch": None}, ddp={"measured": None})
    assert Card.phases(cpu) == ": the rungs 2.0 s"
    assert Card.phases(SimpleNamespace(rows=[], memory={}, ddp={})) == ""


# ---------------------------------------------------------------------------------------- FLOPs, checked
class GroupedNet(nn.Module):
    """A dense, a depthwise and a grouped convolution, then a linear layer: torch's counter counts the last two
    convolutions' weight gradients once per group over (8 and 4 times)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, groups=8),
                                  nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1, groups=4), nn.AdaptiveAvgPool2d(1),
                                  nn.Flatten(), nn.Linear(16, 10))

    def forward(self, x):
        return self.body(x)


def grouped_hand_count(size=16):
    """(forward, training step) FLOPs per sample by hand: 2 per multiply-add; the first convolution's input needs
    no gradient (2 passes), every other layer 3 (forward, input gradient, weight gradient)."""
    hw = size * size
    macs = [hw * 8 * 3 * 9, hw * 8 * 1 * 9, hw * 16 * 2 * 9, 16 * 10]  # positions x out x in per group x kernel
    passes = [2, 3, 3, 3]
    return 2 * sum(macs), 2 * sum(m * p for m, p in zip(macs, passes))


def test_grouped_and_depthwise_convolutions_are_counted_per_group():
    forward, train = grouped_hand_count()
    x, y = torch.rand(4, 3, 16, 16), torch.randint(0, 10, (4,))
    probe = card_module.probe_model(ownmodel_parts(GroupedNet, x, y), tl.TrainConfig(device="cpu"))
    assert abs(probe["flops_forward"] - forward) <= 0.1 * forward
    assert abs(probe["flops_per_sample"] - train) <= 0.1 * train, (probe["flops_per_sample"], train)
    assert "per group" in probe["flops_how"]  # torch's own count is named beside it
    from tutorial_lib import models

    assert abs(models.train_flops(GroupedNet(), x, y) / 4 - train) <= 0.1 * train  # the ladder's and 04's MFU too


def ownmodel_parts(factory, x, y):
    from tutorial_lib import ownmodel

    return ownmodel.Parts(factory, lambda: (x, y))


def test_a_count_beyond_what_a_backward_pass_needs_falls_back_to_three_forwards():
    from tutorial_lib import flops

    step = flops.checked(forward=1e9, counted=12e9, per_group=12e9)
    assert step.train == 3e9 and step.rule == "three_forward" and "3x the forward" in step.how
    assert flops.checked(1e9, 2.9e9, 2.9e9).rule == "counted"
    assert "below the 2x" in flops.checked(1e9, 1.2e9, 1.2e9).how  # frozen layers: kept, and said


# ---------------------------------------------------------------------------------------- out of memory
def _oom(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                                 "139.80 GiB of which 1.10 GiB is free.")


def test_out_of_memory_in_the_engine_and_the_card_is_one_line(monkeypatch, tmp_path, capsys):
    """torch.OutOfMemoryError came through as a traceback (only the largest-batch search caught it): the engine's
    step loop, the card's bench and its probe now end in one line with the batch, the memory and the fix."""
    from tutorial_lib import engine, oom

    monkeypatch.setattr(engine.Run, "train_step", _oom)
    assert cli.main(["train", "model=resnet18_imagenet", "dataset=shapes", "train_size=64", "steps=2", "timing_warmup=0", "batch_size=8",
                     "device=cpu",
                     "eval=false", "tensorboard=false", f"out_dir={tmp_path / 'train'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: out of memory at batch 8 asking for 2.00 GiB more on cpu"), err
    assert "batch_size=4" in err and "precision=bf16" in err and "activation checkpointing" in err
    with pytest.raises(oom.OutOfMemory, match="out of memory at batch 4 asking for 2.00 GiB more on cpu"):
        tl.card(nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10)), images(), quiet=True, out=str(tmp_path / "c"))
    monkeypatch.setattr(nn.Linear, "forward", _oom)
    with pytest.raises(oom.OutOfMemory, match="at batch 4 asking"):
        card_module.probe_model(ownmodel_parts(lambda: nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10)),
                                               *images()()), tl.TrainConfig(device="cpu"))


def test_fragmentation_names_expandable_segments(monkeypatch):
    from tutorial_lib import oom

    monkeypatch.setattr(oom, "_memory", lambda device: ("NVIDIA H200: the step reached 130,000 MiB", 30 * 2**30))
    line = oom.message(RuntimeError("CUDA out of memory."), torch.device("cuda"), 512, "bf16")
    assert "30,720 MiB were reserved but unallocated" in line and "expandable_segments:True" in line
    assert "precision=bf16" not in line and "batch_size=256" in line  # bf16 already: not offered


def test_warmup_0_is_taken_and_a_window_of_0_is_refused(tmp_path):
    """The card refused warmup=0 saying >= 0 is allowed, and ran window=0 as windows of 1 without a word."""
    opts, _ = card_module.split_overrides({"warmup": "0", "window": "1"})
    assert card_module.sized(tl.lessons.size.current(True), opts).warmup == 0
    for key, bad in (("window", "0"), ("steps", "0"), ("warmup", "-1"), ("job_steps", "x")):
        with pytest.raises(UserError) as e:
            card_module.split_overrides({key: bad})
        assert str(e.value).startswith(f"{key}={bad!r}: ") and f"give {key}={int(key == 'warmup') ^ 1} or more" in \
            str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------- the input as a limit
def slow_batches(delay_s=0.1):
    """A batch function that builds every batch on the CPU slowly (a decode, an augmentation): 100 ms a batch, far
    slower than the model's step even on a loaded 2-core machine."""
    import time

    def batch():
        time.sleep(delay_s)
        return torch.rand(8, 64), torch.randint(0, 10, (8,))
    return batch


def test_a_slow_batch_function_is_named_as_what_caps_the_rungs(tmp_path):
    """On a segmentation network with a CPU batch function the page called the step compute-bound beside 61% of the
    time waiting, and never said what the model alone reaches: each rung that waited is run on one resident batch."""
    c = tl.card(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)), slow_batches(), quiet=True,
                rungs="fp32", out=str(tmp_path / "slow"))
    fp32 = c.rows[0]
    assert card_input.waited(fp32) > card_input.WAIT_SHARE and fp32["resident"]["img_s"] > 1.2 * fp32["img_s"]
    assert card_input.cap(fp32) == "input" and "| input: the model alone " in c.rung_table()
    assert "speed up the input first" in c.markdown()
    cells = [x for line in c.markdown().splitlines() if line.startswith("| ") for x in line.strip("|").split(" | ")]
    assert not card_verdict.too_long(cells), card_verdict.too_long(cells)  # a CPU card's page too


def test_a_model_alone_the_rule_cant_yet_tell_is_timed_again_as_long_as_the_rung():
    """Six timed steps of a 0.6 ms model alone beside a rung of 100 ms batches: a few stalled steps of a loaded CPU
    made the cap 'not settled' (p90 step 69 ms). The model alone runs again, its steps filling the rung's time."""
    rung = {"rung": "fp32", "batch": 8, "img_s": 80.0, "step_ms": 100.0, "step_ms_p10": 99.0, "step_ms_p90": 101.0,
            "steps": 7, "data_wait_ms": 90.0, "skipped": None}  # 6 timed steps: 600 ms

    def alone(step_ms, p90_ms, steps):
        return {"img_s": 8000 / step_ms, "step_ms": step_ms, "step_ms_p10": step_ms, "step_ms_p90": p90_ms,
                "steps": steps, "batch": 8, "data_wait_ms": 0.0, "skipped": None}
    stalled, steady = alone(0.6, 69.0, 7), alone(0.6, 0.7, 1001)
    asked = []

    def measure(*answers):
        return lambda n: asked.append(n) or answers[len(asked) - 1]
    assert card_input.cap({**rung, "resident": stalled}) == "not settled"
    got = card_input.add_resident(rung, measure(stalled, steady), 6)
    assert asked == [6, 1000] and got["resident"]["steps"] == 1001 and card_input.cap(got) == "input"
    asked.clear()
    assert card_input.add_resident(rung, measure(steady), 6)["resident"]["steps"] == 1001 and asked == [6]
    asked.clear()  # a second run that failed keeps the first; a model as slow as the rung still runs 2 x 6 steps
    assert card_input.add_resident(rung, measure(stalled, {"skipped": "failed"}), 6)["resident"] == \
        {k: stalled.get(k) for k in card_input.KEPT}
    assert card_input.alone_steps(rung, alone(100.0, 100.0, 7), 6) == 12
    assert card_input.alone_steps(rung, alone(1e-6, 1e-6, 7), 6) == card_input.ALONE_MAX_STEPS


def test_a_rung_that_hardly_waited_is_not_run_again():
    row = {"rung": "fp32", "img_s": 1000.0, "batch": 10, "data_wait_ms": 0.2, "skipped": None}  # 2% of a 10 ms step
    assert card_input.WAIT_SHARE > 0.02
    assert card_input.add_resident(row, lambda n: pytest.fail("measured again"), 6) is row
    assert card_input.cap(row) == "model" and card_input.cap_cell(row) == "model (waited 2% of the step)"
    one = ownmodel_parts(lambda: nn.Linear(4, 2), torch.rand(2, 4), torch.zeros(2, dtype=torch.long))
    assert card_input.resident_parts(dataclasses_replace(one, source=(torch.rand(2, 4), torch.zeros(2))), tl.TrainConfig()) is None


def dataclasses_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


# ---------------------------------------------------------------------------------------- decided by the rule
def _row(rung, img_s, blocks=None, steps=6):
    return {"rung": rung, "img_s": img_s, "batch": 10, "steps": steps, "step_ms": 1000 * 10 / img_s,
            "step_ms_p10": 1000 * 10 / img_s, "step_ms_p90": 1000 * 10 / img_s, "step_ms_blocks": blocks,
            "compile_s": None, "skipped": None}


def test_a_rung_the_rule_cannot_tell_apart_is_run_longer_within_the_budget():
    """Rungs timed for about a second had bands of -26%/+16%: bf16 'slower' than tf32 on a convolutional network.
    A rung whose interval cannot decide is run again for the steps the rule asks for, where the budget holds them."""
    import time

    from tutorial_lib.lessons import card_decide

    base = _row("fp32", 100.0, [100.0, 101.0, 99.0], steps=30)
    noisy = _row("tf32", 104.0, [60.0, 140.0, 90.0], steps=30)  # x1.04 with an interval far wider than ±5%
    asked = []
    again = card_decide.settle([base], noisy, lambda n: asked.append(n) or _row("tf32", 104.0, steps=n),
                               time.perf_counter() + 600)
    assert asked and asked[0] > 30 and again["settled_from_steps"] == 30 and again["steps"] == asked[0]
    assert card_decide.settle([base], noisy, lambda n: pytest.fail("no time"), time.perf_counter()) is noisy
    clear = _row("tf32", 300.0, [33.0, 33.5, 33.2], steps=30)
    assert card_decide.settle([base], clear, lambda n: pytest.fail("decided"), time.perf_counter() + 600) is clear


def test_a_change_that_measured_slower_is_left_out_and_the_recommendation_measured(tmp_path):
    """The GPT card recommended bf16 x0.73 and compile x0.78 because the rungs stack; a change measured slower than
    the row it changed is now undone, and the recommendation is trained as recommended."""
    from tutorial_lib.lessons import card_decide

    cfg = tl.TrainConfig(device="cpu", out_dir=str(tmp_path / "runs"))
    probe = {"device_type": "cpu", "convolutions": False}
    plan = card_module.rung_plan(cfg, probe, None, False)
    rows = [_row("fp32", 100.0), _row("bf16", 50.0), _row("fused_adamw", 120.0)]  # bf16 slower, fused faster
    rows = [next((r for r in rows if r["rung"] == rung.name), None) or {"rung": rung.name, "skipped": why}
            for rung, _, why in plan]
    card_module.ladder.add_speedups(rows)
    rec = card_module.recommend(rows, plan)
    assert rec["rung"] == "fused_adamw" and rec["config"].precision == "bf16"
    measured = []
    out = card_decide.recommendation(rows, plan, rec, lambda c: measured.append(c) or _row("recommended", 130.0),
                                     card_module.SPEED_KEYS)
    assert measured and measured[0].precision == "fp32" and measured[0].optimizer_impl == "fused"
    assert out["dropped"] == ["bf16"] and out["changes"] == {"optimizer_impl": "fused"} and out["row"]["img_s"] == 130.0
    worse = card_decide.recommendation(rows, plan, rec, lambda c: _row("recommended", 60.0), card_module.SPEED_KEYS)
    assert worse["row"] is rec["row"] and "measured slower" in worse["why_kept"]  # the changes interact: kept


def test_rungs_are_settled_after_all_of_them_ran_and_only_at_full_size():
    """Running one rung longer never leaves a later one unmeasured: the settling comes after the rungs, with the
    time left; a card at the small size (CI, a laptop) does not settle at all."""
    import time

    from tutorial_lib.lessons import card_decide

    cfg = tl.TrainConfig(device="cpu")
    plan = card_module.rung_plan(cfg, {"device_type": "cpu", "convolutions": False}, None, False)
    rows = [_row("fp32", 100.0, [100.0, 101.0, 99.0], steps=30), _row("bf16", 104.0, [60.0, 140.0, 90.0], steps=30)]
    rows += [{"rung": r.name, "skipped": why or "left out"} for r, _, why in plan if r.name not in ("fp32", "bf16")]
    asked = []
    out = card_decide.settle_all(rows, plan, lambda rung, c, n: asked.append((rung.name, n)) or
                                 _row(rung.name, 104.0, steps=n), time.perf_counter() + 600)
    assert [a[0] for a in asked] == ["bf16"] and out[1]["settled_from_steps"] == 30 and out[0] is rows[0]
    assert not card_module.SMALL.settle and card_module.FULL.settle
