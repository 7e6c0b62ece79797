"""The README stays a user's document: under 300 lines, and every command-line flag it shows
for ``bench.sh`` / ``python -m flashattn`` is one the command line accepts."""
from __future__ import annotations

import os
import re

from flashattn import cli

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def test_readme_is_short():
    with open(README) as f:
        assert len(f.read().splitlines()) < 300


def test_every_bench_flag_in_readme_is_accepted():
    text = open(README).read()
    shown = set()
    for line in text.splitlines():
        if "bench.sh" in line or "flashattn bench" in line:
            shown.update(re.findall(r"`?(--[a-z][a-z0-9-]*)", line))
    assert {"--quick", "--plot"} <= shown, shown
    options = {opt for action in cli.build_parser()._subparsers._group_actions[0]
               .choices["bench"]._actions for opt in action.option_strings}
    assert shown <= options, shown - options
