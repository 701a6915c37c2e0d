"""Exception types shared by the project (pure: no imports beyond the standard library)."""


class SettingError(ValueError):
    """A configuration value is invalid (unknown mode or policy, out-of-range layer, empty or repeated budgets, ...).

    The entry points (``evaluate.py`` / ``train.py``) print it as one line naming the setting instead of a
    traceback; internal invariant failures stay plain ``ValueError`` and keep theirs.
    """
