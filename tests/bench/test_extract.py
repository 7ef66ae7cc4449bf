"""memrl bench extract: the client wrapper."""


def test_counting_client_passes_the_writers_adapter_switch_through():
    """A per-role adapter's writer switches adapters through the client the bench wraps the policy in."""
    from memrl.bench.extract import CountingClient
    from memrl.policy.base import Capability, capabilities

    class Switching:
        tokenizer = None
        capabilities = frozenset(Capability)

        def use_adapter(self, name):
            return f"switched to {name}"

    wrapped = CountingClient(Switching())
    assert wrapped.use_adapter("memory") == "switched to memory"
    assert capabilities(wrapped) == {Capability.ADAPTERS}  # a draft check would bypass the token counts
    assert not hasattr(CountingClient(type("Plain", (), {"tokenizer": None})()), "use_adapter")
