"""Thin LightningModules: each wraps one model-family object for ``predict``, ``fit`` or ``test``."""
