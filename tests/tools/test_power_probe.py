"""benchmarks/probes/power_probe.py's pure parts (the probe itself needs a GPU and nvidia-smi)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "probes"))

import power_probe  # noqa: E402


def test_parse_samples_reads_clock_power_and_reason_mask():
    text = "1755, 690.12, 0x0000000000000004\n1980, 312.5, 0x0000000000000000\n"
    assert power_probe.parse_samples(text) == [(1755.0, 690.12, 4), (1980.0, 312.5, 0)]


def test_parse_samples_skips_unreadable_lines():
    text = "clocks.sm, power.draw, clocks_event_reasons.active\n[N/A], [N/A], [N/A]\n1650, 6"
    assert power_probe.parse_samples(text) == []


def test_flops_match_the_grid_rule():
    # ANCHORS.md: fwd 4 b s^2 h d (halved when causal), bwd 2.5 x fwd; b = 16384 / s, h = 2048 / d
    assert power_probe._flops(128, False, "fwd", 16384) == 4 * 16384 ** 2 * 16 * 128
    assert power_probe._flops(128, True, "bwd", 2048) == 2.5 * 4 * 8 * 2048 ** 2 * 16 * 128 / 2
