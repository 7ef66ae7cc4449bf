import pytest

from memrl.registry import Registry, RegistryError


def test_register_get_and_unknown_lists_choices():
    reg = Registry("reward function")

    @reg.register("em")
    def em(a, b):
        return float(a == b)

    reg.register("f1")(lambda a, b: 0.0)
    assert reg.get("em") is em
    with pytest.raises(RegistryError, match=r"unknown reward function 'emm'; valid choices: em, f1"):
        reg.get("emm")


def test_duplicate_registration_rejected():
    reg = Registry("tool")
    reg.register("python")(object())
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("python")(object())


def test_dotted_path_escape_hatch():
    reg = Registry("scorer")
    import os.path

    assert reg.get("os.path:join") is os.path.join
    with pytest.raises(RegistryError, match="cannot import module 'no_such_mod_xyz'"):
        reg.get("no_such_mod_xyz:f")
    with pytest.raises(RegistryError, match="has no attribute 'nope'"):
        reg.get("os.path:nope")


def test_populate_runs_once_on_first_lookup():
    calls = []
    reg = Registry("thing", populate=lambda: calls.append(1) or reg.register("a")(1))
    assert calls == []
    assert reg.names() == ["a"] and reg.get("a") == 1
    assert calls == [1]


def test_a_plugin_module_registers_its_parts_on_import(tmp_path, monkeypatch):
    from memrl.registry import import_plugins

    kind = Registry[object]("thing")
    (tmp_path / "my_method.py").write_text(
        "import tests.test_registry as host\nhost.PLUGIN_TARGET.register('mine')(object)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    globals()["PLUGIN_TARGET"] = kind
    assert "mine" not in kind
    import_plugins(["my_method"])
    assert kind.get("mine") is object
    with pytest.raises(RegistryError, match="plugins: cannot import module 'no_such_method'"):
        import_plugins(["no_such_method"])
