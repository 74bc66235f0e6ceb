"""A notebook prints a job file's key lines and its path, never the whole file (tutorial_lib.jobkeys)."""
from tutorial_lib import jobs
from tutorial_lib.config import TrainConfig
from tutorial_lib.jobkeys import key_lines


def test_write_prints_the_key_lines_not_the_file(tmp_path, capsys):
    cfg = TrainConfig(model="resnet18", batch_size=256, steps=100, eval=False)
    path = jobs.write("t_keys", cfg, gpus_per_node=1, time="00:15:00", nsys=True, jobs_dir=tmp_path,
                      description="a test job")
    out, text = capsys.readouterr().out, path.read_text()
    assert "#SBATCH" not in out and "#!/bin/bash" not in out and len(out.splitlines()) <= 6
    assert "--gpus-per-node=1" in out and "--time=00:15:00" in out and f"sbatch {jobs.shown_path(path)}" in out
    assert "nsys profile" in out and "batch_size=256" in out and f"({len(text.splitlines())} lines)" in out


def test_key_lines_of_a_sweep_name_the_array_and_fold_long_options():
    text = ("#!/bin/bash\n# x.sbatch - d\n# 1 node x 1 GPU: one process.\n#SBATCH --job-name=x\n"
            "#SBATCH --array=0-4\n#SBATCH --time=00:20:00  # stopped after this\n"
            "program=(\n    -m tutorial_lib train\n    steps=3\n)\n"
            'srun --ntasks=1 --kill-on-bad-exit=1 \\\n    python "${program[@]}"\n')
    got = key_lines(text, "jobs/x.sbatch")
    assert got.splitlines()[0] == "jobs/x.sbatch (12 lines): 1 node x 1 GPU: one process."
    assert "asks for  --time=00:20:00 --array=0-4" in got and "job-name" not in got
    assert "runs      srun python ${program}" in got and "program   -m tutorial_lib train steps=3" in got
