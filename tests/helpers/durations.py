"""Which test files take longest, so that the two xdist workers start with them.

``--dist loadfile`` hands out whole files in collection order; a long file collected last
(tests/train/ sorts late) runs alone while the other worker idles. tests/conftest.py orders
the files by the seconds recorded in tests/durations.json, longest first (files not in it
keep their place, after). Refresh the record from a full run::

    python -m pytest --junitxml=/tmp/junit.xml
    python tests/helpers/durations.py /tmp/junit.xml > tests/durations.json
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

RECORD = Path(__file__).resolve().parents[1] / "durations.json"
AT_LEAST_S = 5.0  # shorter files keep their collection order: where they run hardly matters


def recorded() -> dict[str, float]:
    """File (``tests/train/test_train_continue.py``) -> seconds, from tests/durations.json."""
    try:
        return {str(k): float(v) for k, v in json.loads(RECORD.read_text()).items()}
    except FileNotFoundError:
        return {}


def from_junit(path: str) -> dict[str, float]:
    """Seconds per test file in a junit XML report (``pytest --junitxml``)."""
    seconds: Counter[str] = Counter()
    for case in ET.parse(path).iter("testcase"):
        classname = case.get("classname", "")
        parts = classname.split(".")
        module = next((i for i, p in enumerate(parts) if p.startswith("test_")), None)
        if parts[0] != "tests" or module is None:
            continue  # the doctests: short
        seconds["/".join(parts[: module + 1]) + ".py"] += float(case.get("time", 0))
    return {f: round(s, 1) for f, s in seconds.most_common() if s >= AT_LEAST_S}


if __name__ == "__main__":
    json.dump(from_junit(sys.argv[1]), sys.stdout, indent=1)
    sys.stdout.write("\n")
