"""Exception types shared by the project (pure: no imports beyond the standard library)."""


class SettingError(ValueError):
    """A configuration value is invalid (unknown mode or policy, out-of-range layer, empty or repeated budgets, ...).

    The entry points (``evaluate.py`` / ``train.py``) print it as one line naming the setting instead of a
    traceback; internal invariant failures stay plain ``ValueError`` and keep theirs.
    """


def check_int(name: str, value, low: int, allow_none: bool = False, none_means: str = "") -> None:
    """Raise :class:`SettingError` naming ``name`` unless ``value`` is an integer (not a bool) ``>= low``, or
    ``None`` when ``allow_none`` (``none_means`` says what null does, for the message). The message shows a
    ``None`` as the config's ``null``."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        tail = f", or null for {none_means}" if allow_none and none_means else (", or null" if allow_none else "")
        shown = "null" if value is None else repr(value)
        raise SettingError(f"{name}={shown}: expected an integer >= {low}{tail}")


class CheckpointError(ValueError):
    """A checkpoint directory holds a file that cannot be read or does not fit the model (a truncated or corrupted
    safetensors file, invalid JSON, missing / unexpected / mis-shaped weights). The message names the path; the
    entry points print it as one line."""


MODEL_DTYPES = ("bfloat16", "float16", "float32")


def check_dtype(name: str, value) -> str:
    """``value`` when it is one of the model dtypes (``MODEL_DTYPES``: the names of ``torch.bfloat16``,
    ``torch.float16``, ``torch.float32``), else :class:`SettingError` naming ``name`` and the allowed values, e.g.
    ``model.init_args.dtype: 'bf15' is not a torch dtype the models run in; use one of bfloat16, float16, float32``.
    Called in the modules' ``__init__``, so a bad dtype stops the run before anything is written."""
    if not isinstance(value, str) or value not in MODEL_DTYPES:
        raise SettingError(f"{name}: {value!r} is not a torch dtype the models run in; use one of "
                           f"{', '.join(MODEL_DTYPES)}")
    return value
