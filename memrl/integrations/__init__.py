"""Optional integrations with other training frameworks (``memrl.integrations.verl``: verl rollout hook)."""
