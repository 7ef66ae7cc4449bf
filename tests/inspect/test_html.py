"""The HTML page: structure (always) and a real render in headless Chromium (skipped without chromium)."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from memrl.inspect import load_run, write_html
from memrl.inspect.html import render_html, reward_colour

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


@pytest.fixture(scope="module")
def view(demo_run):
    run = load_run(demo_run)
    # the episode with the most leaves of different reward shows both leaf colours
    return max(run.episode_views(), key=lambda v: (len(set(v.rewards)), len(v.tree)))


def test_page_is_self_contained_and_complete(view):
    page = render_html(view)
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert page.count('<g class="node') == len(view.tree)
    assert page.count('<li class="fact') == len(view.facts)
    assert page.count('<tr class="retrieved">') == len(view.retrieved)
    assert page.count('class="branch"') == sum(n.is_branch_point for n in view.tree.values())
    for node in view.tree.values():
        if node.is_branch_point:
            assert f"H={node.entropy:.2f}" in page
    for leaf in view.leaves:
        assert reward_colour(leaf.reward) in page


def test_reward_colour_runs_red_to_green():
    assert reward_colour(0.0) == "#d6453c" and reward_colour(None) == "#b8c0c8"
    red0, green0 = int(reward_colour(0)[1:3], 16), int(reward_colour(0)[3:5], 16)
    red1, green1 = int(reward_colour(1)[1:3], 16), int(reward_colour(1)[3:5], 16)
    assert red0 > green0 and green1 > red1


def _chromium(args: list[str], tmp_path, timeout: float = 90) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_chromium_renders_tree_and_facts(view, tmp_path):
    import matplotlib.image as mpimg

    page = write_html(view, tmp_path / "episode.html")
    dom = _chromium(["--dump-dom", page.as_uri()], tmp_path).stdout
    assert len(re.findall(r'<g class="node', dom)) == len(view.tree) >= 3
    assert len(re.findall(r'<li class="fact', dom)) == len(view.facts) > 0
    assert 'id="tree"' in dom and 'id="facts"' in dom

    png = tmp_path / "shot.png"
    _chromium([f"--screenshot={png}", "--window-size=1400,1800", page.as_uri()], tmp_path)
    img = mpimg.imread(png)[..., :3]  # [H, W, 3] floats in 0..1
    assert img.shape[:2] == (1800, 1400)
    assert img.std() > 0.05, "blank page"
    # the tree is drawn: leaf boxes in the reward colours of this episode's leaves are on screen
    for r in {leaf.reward for leaf in view.leaves}:
        rgb = np.array([int(reward_colour(r)[i : i + 2], 16) for i in (1, 3, 5)]) / 255.0
        hits = (np.abs(img - rgb).max(axis=-1) < 0.02).sum()
        assert hits > 500, f"no leaf box in colour {reward_colour(r)} (reward {r}) on the screenshot"
