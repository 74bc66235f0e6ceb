"""The key lines of a job file, as a notebook prints them: its path, what it asks Slurm for, what it runs and how
to submit it; the file itself explains every line (torch-free).

    print(key_lines(text, "jobs/02_nsys.sbatch"))
    jobs/02_nsys.sbatch (91 lines): 1 node x 1 GPU: one process (launch mode single).
      asks for  --nodes=1 --gpus-per-node=1 --cpus-per-task=8 --time=00:15:00
      runs      srun ... nsys profile ... python -m tutorial_lib train dataset=shapes model=resnet18 ...
      submit    sbatch jobs/02_nsys.sbatch
"""
import re

ASKED = ("nodes", "gpus-per-node", "gres", "gpus", "cpus-per-task", "mem", "time", "array", "partition", "account",
         "reservation")  # the #SBATCH options a learner reads; the file holds the others
SBATCH = re.compile(r"^#SBATCH\s+--([\w-]+)(?:=(\S+))?")
LAUNCH = re.compile(r"^\s*(srun|torchrun|mpirun|python)\b(?! -c)")
WIDTH = 160  # characters of the 'runs' line


def asked(text: str) -> str:
    got = {m.group(1): m.group(2) for m in map(SBATCH.match, text.splitlines()) if m}
    return " ".join(f"--{k}={got[k]}" if got[k] else f"--{k}" for k in ASKED if k in got)


def program(text: str) -> list[str]:
    """The training's words from the file's `program=( ... )` block ([] when it has none)."""
    m = re.search(r"^program=\(\n(.*?)^\)", text, re.M | re.S)
    return [w.strip() for w in m.group(1).splitlines() if w.strip()] if m else []


def launch(text: str) -> str:
    """The first launch line of the run (srun, torchrun, python), its continuation lines joined, each long
    option folded to its name: what starts the processes, not every path."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if LAUNCH.match(line):
            words, j = line.rstrip(" \\").split(), i
            while lines[j].rstrip().endswith("\\") and j + 1 < len(lines):
                j += 1
                words += lines[j].rstrip(" \\").split()
            if words[0] == "srun":  # its own options are the same in every job: the file explains them
                words = ["srun"] + [w for w in words[1:] if not w.startswith("--")][:1] + words[1:][
                    next((k for k, w in enumerate(words[1:]) if not w.startswith("--")), len(words)) + 1:]
            return " ".join(w.split("=", 1)[0] + "=..." if w.startswith("--") and len(w) > 40 else w for w in words)
    return ""


def key_lines(text: str, where: str) -> str:
    lines = text.splitlines()
    layout = next((x[2:] for x in lines[1:4] if re.match(r"# \d+ nodes? x ", x)), "")
    run, trains = launch(text).replace('"${program[@]}"', "${program}"), " ".join(program(text))
    rows = [f"{where} ({len(lines)} lines){': ' + layout if layout else ''}", f"  asks for  {asked(text)}"]
    for label, words in (("runs", run), ("program", trains)):
        if words:
            rows.append(f"  {label:<8}  {words if len(words) <= WIDTH else words[:WIDTH - 4] + ' ...'}")
    rows.append(f"  submit    sbatch {where}   (read the file: a comment explains every line)")
    return "\n".join(rows)
