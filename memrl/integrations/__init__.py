"""Optional integrations with other training frameworks (``memrl.integrations.verl``: memrl as a verl agent loop)."""
