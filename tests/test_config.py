import pytest

from memrl.config import Config, ConfigError, load_config, to_yaml


def test_defaults_yaml_and_overrides_layer(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 3\nrollout:\n  n: 8\npolicy:\n  temperature: 0.5\n")
    cfg = load_config(path, ["policy.temperature=0.7", "data.adapter=locomo"])
    assert isinstance(cfg, Config)
    assert cfg.seed == 3 and cfg.rollout.n == 8
    assert cfg.policy.temperature == 0.7 and cfg.data.adapter == "locomo"
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


def test_committed_configs_load_and_the_training_pair_differs_only_in_the_rollout():
    import dataclasses
    from pathlib import Path

    configs = Path(__file__).resolve().parents[1] / "configs"
    loaded = {p.stem: load_config(p) for p in sorted(configs.glob("*.yaml"))}
    assert {"synthetic", "synthetic_tree", "synthetic_chain", "locomo"} <= set(loaded)
    tree, chain = loaded["synthetic_tree"], loaded["synthetic_chain"]
    assert (tree.rollout.strategy, chain.rollout.strategy) == ("tree", "chain")
    assert dataclasses.replace(chain.rollout, strategy="tree", tree=tree.rollout.tree) == tree.rollout
    same = dataclasses.replace(chain, output_dir=tree.output_dir, rollout=tree.rollout)
    assert same == tree  # the learning comparison (README) changes nothing else


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
