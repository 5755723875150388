"""User-facing errors: each names the field at fault and what is allowed."""


class HfspecError(ValueError):
    """A mistake a user can make (bad argument, bad preset, missing model)."""


def bad_value(field: str, value, allowed: str) -> HfspecError:
    """Build the standard message: field, the value given, and what is allowed."""
    return HfspecError(f"{field}: got {value!r}; allowed: {allowed}")
