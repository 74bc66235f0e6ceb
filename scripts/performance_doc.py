"""Render docs/performance.md from the ladder's reference files (notebooks/reference/04_ladder_<card>.json,
written by scripts/gpu/ladder.sh on each card, and 04_roofline_<card>.json, written by
`python -m tutorial_lib ladder --roofline --reference`): python scripts/performance_doc.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tutorial_lib import ladder, reference  # noqa: E402

records = [reference.load(p.stem) for p in sorted(reference.FOLDER.glob("04_ladder_*.json"))]
rooflines = [reference.load(p.stem) for p in sorted(reference.FOLDER.glob("04_roofline_*.json"))]
path = reference.FOLDER.parents[1] / "docs" / "performance.md"
path.parent.mkdir(exist_ok=True)
path.write_text(ladder.performance_doc(records, rooflines))
print(f"wrote {path.relative_to(path.parents[1])} from {len(records)} reference file(s)")
