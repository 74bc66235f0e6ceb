#!/usr/bin/env python3
"""Render every job of the workbook (jobs/*.sbatch) again for a workshop: its site, account and reservation.

    python scripts/workshop_jobs.py --site mycluster --account proj42 --reservation hpc_workshop
    python scripts/workshop_jobs.py --site mycluster --reservation hpc_workshop --out jobs   # in place

Each file is rendered from its own `# workbook-render:` record (what its notebook asked for), with the site
profile, account and reservation given here; the files go to --out (default jobs-workshop/, so the
committed jobs/ stay as the notebooks render them). Learners submit them with
`python -m tutorial_lib jobs submit jobs-workshop/<name>.sbatch --wait`.
"""
import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tutorial_lib import jobs, sites  # noqa: E402  (torch-free)
from tutorial_lib.config import UserError, load  # noqa: E402


def render_all(site: str, out: Path, account: str | None = None, reservation: str | None = None,
               source: Path = jobs.JOBS_DIR) -> list[Path]:
    """Write each source/*.sbatch rendered again for `site` (+ account, reservation) into `out`."""
    written = []
    for path in sorted(source.glob("*.sbatch")):
        rec = jobs.render_record(path)
        resources = {**rec["resources"], **{k: v for k, v in (("account", account), ("reservation", reservation))
                                            if v}}
        cfg = load(None, rec["overrides"]) if rec.get("overrides") is not None else None
        try:
            written.append(jobs.write(rec["name"], cfg, site=site, command=rec.get("command"), sweep=rec.get("sweep"),
                                      description=rec.get("description"), jobs_dir=out, show=False, **resources))
        except UserError as e:
            raise UserError(f"{path.name}: {e}") from None
    return written


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--site", required=True, help=f"site profile: {', '.join(sites.site_names())} or a YAML file")
    p.add_argument("--account", help="the project the workshop's hours are charged to")
    p.add_argument("--reservation", help="the workshop's Slurm reservation")
    p.add_argument("--out", type=Path, default=ROOT / "jobs-workshop", help="folder for the files (jobs-workshop/)")
    args = p.parse_args()
    try:
        paths = render_all(args.site, args.out, args.account, args.reservation)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path in paths:
        print(os.path.relpath(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
