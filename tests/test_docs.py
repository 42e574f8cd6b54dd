"""The documentation site builds with no warning: no broken link or anchor, every page in the
nav, every docstring rendered (``mkdocs build --strict``, configured in ``mkdocs.yml``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import REPO
from rankwise.testing import child_env, run_isolated, run_script

ROOT = REPO

for _module in ("mkdocs", "material", "mkdocstrings_handlers.python"):
    pytest.importorskip(_module, reason=f"{_module} is not installed: pip install -e '.[dev]'")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=170)
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("WARNING")]
    assert proc.returncode == 0 and not warnings, proc.stderr[-5000:]
    return out


def test_site_builds_strict_without_warnings(site: Path) -> None:
    for page in ("", "quickstart", "concepts", "troubleshooting", "api/train"):
        assert (site / page / "index.html").exists(), page


def test_api_reference_renders_the_docstrings(site: Path) -> None:
    html = (site / "api" / "data" / "index.html").read_text()
    assert 'id="rankwise.data.DistributedSampler"' in html
    # Doctests are fenced code (scripts/mkdocs_docstrings.py), not a paragraph of ">>>" text.
    assert 'class="gp">&gt;&gt;&gt; </span>' in html
    for page in sorted((site / "api").glob("*/index.html")):
        text = page.read_text()
        assert not re.search(r"<p>&gt;&gt;&gt;", text), page
        assert not re.search(r":(func|class|meth|data|mod|attr|exc):", text), page


# -- the quick start's code runs as the page says (docs/quickstart.md includes these files) ----

EXAMPLES = ROOT / "examples"


def _one_process(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_isolated(
        [sys.executable, str(EXAMPLES / script), *args], env=child_env(), timeout=170
    )


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_quickstart_trainer_resumes_on_two_ranks(tmp_path: Path) -> None:
    first = _one_process("quickstart_trainer.py", f"--out={tmp_path}", "--epochs=1")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "epoch 1/1 done" in first.stdout and "epochs 1 steps 43 ranks 1" in first.stdout
    args = [f"--out={tmp_path}", "--epochs=2", "--batch-size=16"]
    second = run_script(EXAMPLES / "quickstart_trainer.py", 2, script_args=args, timeout=170)
    assert second.returncode == 0, second.stderr[-3000:]
    # Resumed: only the second epoch ran, on 2 ranks; the global batch (32) was kept, so no
    # warning and the same 43 steps per epoch.
    assert "epoch 1/2" not in second.stdout and "epoch 2/2 done" in second.stdout
    assert "epochs 2 steps 86 ranks 2" in second.stdout
    assert "global batch" not in second.stderr


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_quickstart_loop_resumes_mid_epoch_on_two_ranks(tmp_path: Path) -> None:
    first = _one_process("quickstart_loop.py", f"--out={tmp_path}", "--epochs=1")
    assert first.returncode == 0, first.stderr[-3000:]
    assert re.search(r"^epoch 0 step 57 loss [\d.]+ consumed 1797$", first.stdout, re.M)
    args = [f"--out={tmp_path}", "--epochs=2"]
    second = run_script(EXAMPLES / "quickstart_loop.py", 2, script_args=args, timeout=170)
    assert second.returncode == 0, second.stderr[-3000:]
    # The last checkpoint was step 50 (1,600 of 1,797 consumed); the 197 left make 4 steps of
    # 2 ranks (99 each, padded); then a whole epoch of 1797 / 2 ranks / 32 = 29 steps.
    lines = re.findall(r"^epoch (\d) step (\d+) loss [\d.]+ consumed (\d+)$", second.stdout, re.M)
    assert lines == [("0", "54", "1797"), ("1", "83", "1797")], second.stdout
