"""`dvc plots show` works without the network: its page is .dvc/plots/page.html (.dvc/config's
`plots.html_template`), which inlines the Vega, Vega-Lite and Vega-Embed builds DVC's own page
loads from a CDN, in the very versions dvc-render names. `python -m tests.test_plots` rewrites
the page from the npm registry (after a dvc-render upgrade that names other versions: the test
below says so).

The plots themselves (dvc.yaml's top-level `plots`, drawn with .dvc/plots/curves.json) are
checked on a rendered page in tests/test_pipeline.py and drawn in a browser in tests/test_docs.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.conftest import ROOT

PLOTS = ROOT / ".dvc" / "plots"
PAGE = PLOTS / "page.html"


def dvc_scripts() -> list[str]:
    """The `name@version` of each script DVC's plots page loads, in its order."""
    from dvc_render.vega import VegaRenderer

    return re.findall(r"cdn\.jsdelivr\.net/npm/([\w-]+@[\d.]+)", VegaRenderer.SCRIPTS)


def inlined(page: str) -> list[str]:
    """The `name@version` of each script the page inlines (its `<script>` opening comment)."""
    return re.findall(r"<script>/\* ([\w-]+@[\d.]+) ", page)


def test_dvc_plots_show_uses_the_shipped_page() -> None:
    # a relative path in DVC's config is relative to .dvc/
    config = (ROOT / ".dvc" / "config").read_text()
    section = re.search(r"^\[plots\]\n((?:[ \t]+.*\n)*)", config, re.MULTILINE)
    assert section, config
    assert re.findall(r"^\s+html_template = (\S+)$", section.group(1), re.MULTILINE) == [
        "plots/page.html"]
    assert (ROOT / ".dvc" / "plots" / "page.html").is_file()


def test_the_page_inlines_the_scripts_dvc_would_load() -> None:
    page = PAGE.read_text()
    assert inlined(page) == dvc_scripts() == ["vega@5.20.2", "vega-lite@5.2.0",
                                              "vega-embed@6.18.2"], (
        "dvc-render names other Vega versions: rewrite the page, `python -m tests.test_plots`")
    assert not re.search(r"<script[^>]*\bsrc=", page)  # nothing fetched, from anywhere
    assert page.count("{plot_divs}") == 1 and "{scripts}" not in page  # DVC's CDN tags
    assert page.count("</script>") == 3  # no script's text ends its tag early
    licences = re.findall(r"^([\w-]+@[\d.]+):\nCopyright", page, re.MULTILINE)
    assert licences == dvc_scripts()  # each script's licence, in a comment


def write_page() -> None:
    """Write .dvc/plots/page.html: DVC's page with each script inlined (from the npm registry,
    `npm pack`), its licence in a comment, and no `{scripts}` placeholder (the CDN tags)."""
    names = dvc_scripts()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["npm", "pack", "--silent", *names], cwd=tmp, check=True,
                       capture_output=True, timeout=600)
        scripts, licences = [], []
        for name in names:
            package, version = name.split("@")
            shutil.unpack_archive(Path(tmp) / f"{package}-{version}.tgz", Path(tmp) / package)
            root = Path(tmp) / package / "package"
            code = (root / "build" / f"{package}.min.js").read_text()
            assert "</script" not in code and "<!--" not in code, name
            scripts.append(f"<script>/* {name} ({package}/build/{package}.min.js) */\n{code}\n"
                           "</script>\n")
            licences.append(f"{name}:\n{(root / 'LICENSE').read_text().strip()}\n")
    PAGE.write_text(
        "<!DOCTYPE html>\n<html>\n<head>\n<meta charset=\"utf-8\">\n{refresh_tag}\n"
        "<title>simtune plots</title>\n"
        "<!-- `dvc plots show`'s page (.dvc/config: plots.html_template) with the scripts DVC "
        "loads from a CDN inlined, so that it renders offline. Written by `python -m "
        "tests.test_plots`; the scripts' licences (BSD 3-Clause) are at the end. -->\n"
        + "".join(scripts)
        + "<style>body { font-family: sans-serif; } table { border-spacing: 15px; }</style>\n"
        "</head>\n<body>\n{plot_divs}\n</body>\n</html>\n<!--\n" + "\n".join(licences) + "-->\n")


if __name__ == "__main__":
    write_page()


def test_series_at_one_value_stay_visible() -> None:
    """Issue 36 item 11: P@1 drawn exactly under MRR@10 when both are 1.0. Each series has a
    marker shape of its own, hollow, so a series under another still shows its marker."""
    import json

    lines = json.loads((PLOTS / "curves.json").read_text())["layer"][0]
    assert lines["mark"]["type"] == "line" and lines["mark"]["point"]["filled"] is False
    assert lines["encoding"]["shape"]["field"] == lines["encoding"]["color"]["field"] == "field"
