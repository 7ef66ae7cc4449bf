"""memrl bench extract: the client wrapper."""


def test_counting_client_passes_the_writers_adapter_switch_through():
    """A per-role adapter's writer switches adapters through the client the bench wraps the policy in."""
    from memrl.bench.extract import CountingClient

    class Switching:
        tokenizer = None

        def use_adapter(self, name):
            return f"switched to {name}"

    assert CountingClient(Switching()).use_adapter("memory") == "switched to memory"
    assert not hasattr(CountingClient(type("Plain", (), {"tokenizer": None})()), "use_adapter")
