import dataclasses
from pathlib import Path

import pytest
import yaml

from memrl.config import Config, ConfigError, load_config, to_yaml


def test_defaults_yaml_and_overrides_layer(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 3\nrollout:\n  n: 8\n  temperature: 0.5\n")
    cfg = load_config(path, ["rollout.temperature=0.7", "data.adapter=locomo"])
    assert isinstance(cfg, Config)
    assert cfg.seed == 3 and cfg.rollout.n == 8
    assert cfg.rollout.temperature == 0.7 and cfg.data.adapter == "locomo"
    assert load_config(None).rollout.n == Config().rollout.n


def test_unknown_key_lists_valid_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rollout:\n  nn: 8\n")
    with pytest.raises(
        ConfigError, match=r"unknown config key 'rollout.nn'; valid keys under 'rollout': .*\bn\b"
    ):
        load_config(path)
    with pytest.raises(
        ConfigError, match=r"command-line overrides: unknown config key 'sed'; valid keys: seed"
    ):
        load_config(None, ["sed=1"])


def test_bad_override_syntax_and_type_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(None, ["rollout.n"])
    with pytest.raises(ConfigError, match="rollout.n"):
        load_config(None, ["rollout.n=many"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_post_init_validation_surfaces(tmp_path):
    with pytest.raises((ConfigError, ValueError), match="n_samples_per_prompt must be >= 1"):
        load_config(None, ["data.n_samples_per_prompt=0"])


def test_yaml_dump_round_trips(tmp_path):
    cfg = load_config(None, ["rollout.n=6"])
    path = tmp_path / "dump.yaml"
    path.write_text(to_yaml(cfg))
    assert load_config(path) == cfg


CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CONFIG_FILES = sorted(CONFIGS.glob("**/*.yaml"))


def comment_share(text: str) -> float:
    """The share of a YAML file's characters that are comments (whole-line and trailing ``# ...``)."""
    comment = 0
    for line in text.splitlines(keepends=True):
        at = line.find("#")
        if at >= 0 and (at == 0 or line[at - 1] in " \t"):
            comment += len(line) - at
    return comment / max(len(text), 1)


def test_comment_share_counts_whole_line_and_trailing_comments():
    assert comment_share("a: 1\n") == 0.0
    assert comment_share("# abc\n") == 1.0
    assert comment_share("a: 1  # b\n") == pytest.approx(4 / 10)
    assert comment_share("url: a#b\n") == 0.0  # a '#' inside a value is not a comment


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_shipped_config_validates_and_is_mostly_settings(path):
    assert isinstance(load_config(path), Config)
    share = comment_share(path.read_text())
    assert share <= 0.30, f"{path.name}: comments are {share:.0%} of its characters (at most 30 %)"


ARMS = [p for p in CONFIG_FILES if "defaults" in yaml.safe_load(p.read_text())]


@pytest.mark.parametrize("path", ARMS, ids=lambda p: p.name)
def test_an_arm_changes_exactly_the_keys_it_sets(path, tmp_path):
    """An arm over a base restates nothing of it, and changes nothing it does not name."""
    from memrl.config import file_layers, leaf_keys, resolve_config

    own = yaml.safe_load(path.read_text())
    replaced = own.pop("replace", [])  # reset to their defaults: named by the arm too
    bases = [str((path.parent / d).resolve()) for d in own.pop("defaults")]
    base_only = tmp_path / "base_only.yaml"
    base_only.write_text(yaml.safe_dump({"defaults": bases}))
    arm, base = resolve_config(path).config, resolve_config(base_only).config
    changed = {k for k in leaf_keys(own, Config) if _get(arm, k) != _get(base, k)}
    assert changed == set(leaf_keys(own, Config)), f"{path.name} restates its base's values"
    kept = [k for k in _leaves(Config()) if k not in changed and not any(k.startswith(r) for r in replaced)]
    assert all(_get(arm, k) == _get(base, k) for k in kept)
    assert len(file_layers(path)) >= 2


def test_arms_are_small():
    assert len(ARMS) >= 20
    for path in ARMS:
        assert len(path.read_text().splitlines()) <= 25, f"{path.name} is a copy, not an arm"


def _get(obj, dotted):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _leaves(obj, where=""):
    import dataclasses

    out = []
    for f in dataclasses.fields(obj):
        key = f"{where}.{f.name}" if where else f.name
        value = getattr(obj, f.name)
        out += _leaves(value, key) if dataclasses.is_dataclass(value) else [key]
    return out


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_defaults_merge_in_order_then_the_file_then_overrides(tmp_path):
    from memrl.config import resolve_config

    _write(tmp_path / "base.yaml", "seed: 1\nrollout:\n  n: 8\n  temperature: 0.5\n")
    _write(tmp_path / "arms/hot.yaml", "defaults: [../base.yaml]\nrollout:\n  temperature: 1.0\n")
    arm = _write(tmp_path / "arms/arm.yaml", "defaults: [hot.yaml]\nrollout:\n  n: 4\n")
    resolved = resolve_config(arm, ["seed=7"])
    cfg = resolved.config
    assert (cfg.seed, cfg.rollout.n, cfg.rollout.temperature) == (7, 4, 1.0)
    src = resolved.sources
    assert src["seed"] == "override"
    assert src["rollout.n"].endswith("arms/arm.yaml")
    assert src["rollout.temperature"].endswith("arms/hot.yaml")
    assert "policy.model" not in src  # a default no layer set


def test_a_file_shared_by_two_defaults_is_merged_once_where_it_first_appears(tmp_path):
    from memrl.config import load_config

    _write(tmp_path / "base.yaml", "rollout:\n  n: 8\n  temperature: 0.5\n")
    _write(tmp_path / "a.yaml", "defaults: [base.yaml]\nrollout:\n  n: 1\n")
    _write(tmp_path / "b.yaml", "defaults: [base.yaml]\nrollout:\n  temperature: 0.0\n")
    both = _write(tmp_path / "both.yaml", "defaults: [a.yaml, b.yaml]\n")
    cfg = load_config(both)
    # b's base does not undo a's n=1: each file is merged once
    assert (cfg.rollout.n, cfg.rollout.temperature) == (1, 0.0)


def test_defaults_cycle_and_missing_file_and_bad_defaults_are_named(tmp_path):
    _write(tmp_path / "a.yaml", "defaults: [b.yaml]\n")
    _write(tmp_path / "b.yaml", "defaults: [a.yaml]\n")
    with pytest.raises(ConfigError, match=r"cycle: .*a\.yaml -> .*b\.yaml -> .*a\.yaml"):
        load_config(tmp_path / "a.yaml")
    _write(tmp_path / "c.yaml", "defaults: [nope.yaml]\n")
    with pytest.raises(ConfigError, match=r"nope\.yaml.*does not exist \(in the defaults of .*c\.yaml\)"):
        load_config(tmp_path / "c.yaml")
    _write(tmp_path / "d.yaml", "defaults: {base: a.yaml}\n")
    with pytest.raises(ConfigError, match=r"d\.yaml: 'defaults' must be a list"):
        load_config(tmp_path / "d.yaml")


def test_unknown_key_in_an_included_file_names_that_file(tmp_path):
    _write(tmp_path / "base.yaml", "memory:\n  topk: 3\n")
    arm = _write(tmp_path / "arm.yaml", "defaults: [base.yaml]\nseed: 2\n")
    with pytest.raises(
        ConfigError, match=r"base\.yaml: unknown config key 'memory.topk'; valid keys .*top_k"
    ):
        load_config(arm)


def test_every_config_key_is_a_stable_or_an_experiment_knob():
    from memrl.config_knobs import EXPERIMENT, STABLE

    keys = set(_leaves(Config()))
    assert not set(STABLE) & set(EXPERIMENT)
    assert keys - set(STABLE) - set(EXPERIMENT) == set(), "classify the new keys in memrl/config_knobs.py"
    assert set(STABLE) | set(EXPERIMENT) <= keys, "memrl/config_knobs.py names keys that no longer exist"
    assert all(STABLE.values()) and all(EXPERIMENT.values())


def test_every_key_no_recipe_sets_says_why_it_stays():
    from memrl.config import file_layers, leaf_keys
    from memrl.config_knobs import NO_RECIPE, no_recipe_reason

    recipes = sorted(Path(__file__).parents[1].glob("configs/*.yaml"))
    set_by_recipes = {
        key
        for recipe in recipes
        for _, layer in file_layers(recipe)
        for key in leaf_keys({k: v for k, v in layer.items() if k != "replace"}, Config)
    }
    unset = set(_leaves(Config())) - set_by_recipes
    assert sorted(k for k in unset if not no_recipe_reason(k)) == [], (
        "set it in a recipe, name why in NO_RECIPE, or remove it"
    )
    stale = [n for n in NO_RECIPE if not any(k == n or (n.endswith(".") and k.startswith(n)) for k in unset)]
    assert stale == [], "NO_RECIPE names keys a recipe now sets, or that no longer exist"


def test_the_quickstart_trains_on_the_prompt_memrl_eval_scores_and_evaluates_held_out_episodes():
    """configs/quickstart.yaml's adapter is meant for `memrl eval --config configs/synthetic.yaml
    policy.lora_path=...`: same model, tools, memory and prompt settings; its own before/after evaluation is on
    at least 48 test-split episodes, strict EM."""
    from pathlib import Path

    configs = Path(__file__).resolve().parents[1] / "configs"
    quick, ev = load_config(configs / "quickstart.yaml"), load_config(configs / "synthetic.yaml")
    assert quick.policy.model == ev.policy.model and quick.tools.enabled == ev.tools.enabled
    assert quick.memory == ev.memory
    for field in ("context", "use_summary", "prompt_token_budget"):
        assert getattr(quick.episode, field) == getattr(ev.episode, field), field
    assert quick.data.adapter == ev.data.adapter and ev.data.split == quick.train.eval_split == "test"
    assert quick.train.final_eval_episodes >= 48 and quick.train.eval_reward == "exact_match"
    assert quick.train.steps <= 20 and quick.train.max_wall_s is not None


def test_the_tool_recipes_evaluate_on_the_prompt_they_train_on_with_200_held_out_arithmetic_questions():
    """configs/synthetic_tools_eval.yaml scores a synthetic_tools adapter as its training run's final evaluation
    does: same data options, tools, prompt and response budget; the test split holds >= 200 arithmetic questions."""
    from pathlib import Path

    from memrl.data.adapters import run_adapter
    from memrl.train.setup import eval_config

    configs = Path(__file__).resolve().parents[1] / "configs"
    train, ev = (
        load_config(configs / "synthetic_tools.yaml"),
        load_config(configs / "synthetic_tools_eval.yaml"),
    )
    final = eval_config(train)
    assert {k: v for k, v in train.data.options.items() if k != "num_episodes"} == {
        k: v for k, v in ev.data.options.items() if k != "num_episodes"
    }
    assert train.train.final_eval_episodes == ev.data.options["num_episodes"] == 400
    assert train.tools == ev.tools and train.memory == ev.memory and train.policy.model == ev.policy.model
    for field in ("context", "use_summary", "prompt_token_budget", "tool_example", "prompt_template"):
        assert getattr(final.episode, field) == getattr(ev.episode, field), field
    for field in ("max_response_tokens", "max_tool_calls", "rollback", "temperature", "n", "strategy"):
        assert getattr(final.rollout, field) == getattr(ev.rollout, field), field
    test, _ = run_adapter("synthetic", None, split="test", options=dict(ev.data.options))
    assert sum(e.metadata["question_type"] == "arithmetic" for e in test) >= 200
    # Every arm trains on the base's data and prompt under the same budget (which groups train may differ).
    for arm in configs.glob("synthetic_tools_*.yaml"):
        cfg = load_config(arm)
        if arm.name != "synthetic_tools_eval.yaml":
            data = dataclasses.replace(cfg.data, group_filter=train.data.group_filter)
            assert data == train.data and cfg.train.max_wall_s == 1500 and cfg.episode.tool_example, arm.name


def test_a_file_replaces_a_mapping_its_defaults_set_instead_of_adding_to_it(tmp_path):
    from memrl.config import resolve_config

    _write(
        tmp_path / "base.yaml",
        "data:\n  adapter: synthetic\n  options: {num_episodes: 10, phrasing: varied}\n",
    )
    merged = _write(tmp_path / "merged.yaml", "defaults: [base.yaml]\ndata:\n  options: {num_chats: 3}\n")
    replaced = _write(
        tmp_path / "replaced.yaml",
        "defaults: [base.yaml]\nreplace: [data.options]\ndata:\n  options: {num_chats: 3}\n",
    )
    assert resolve_config(merged).config.data.options == {
        "num_episodes": 10,
        "phrasing": "varied",
        "num_chats": 3,
    }
    resolved = resolve_config(replaced)
    assert resolved.config.data.options == {"num_chats": 3}
    assert resolved.sources["data.options"] == str(replaced) or resolved.sources["data.options"].endswith(
        "replaced.yaml"
    )
    # Replaced without keys of its own: back to the default.
    cleared = _write(tmp_path / "cleared.yaml", "defaults: [base.yaml]\nreplace: [data.options]\n")
    assert resolve_config(cleared).config.data.options == {}
    assert resolve_config(cleared).config.data.adapter == "synthetic"


def test_replace_names_config_keys_only(tmp_path):
    from memrl.config import ConfigError, resolve_config

    bad = _write(tmp_path / "bad.yaml", "replace: [data.opts]\n")
    with pytest.raises(ConfigError, match="bad.yaml.*'replace' names 'data.opts', which is not a config key"):
        resolve_config(bad)
    with pytest.raises(ConfigError, match="'replace' must be a list of dotted keys"):
        resolve_config(_write(tmp_path / "worse.yaml", "replace: data.options\n"))


def test_plugins_are_imported_before_the_config_is_built():
    from memrl.memory.extractors import EXTRACTORS

    cfg = load_config(None, ["plugins=[memrl.methods.memagent]", "memory.extractor=memagent"])
    assert cfg.plugins == ["memrl.methods.memagent"] and "memagent" in EXTRACTORS
    with pytest.raises(ConfigError, match="plugins: cannot import module 'not_a_method'"):
        load_config(None, ["plugins=[not_a_method]"])
