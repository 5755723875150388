"""User-facing errors: each names the field at fault and what is allowed."""


class HfspecError(ValueError):
    """A mistake a user can make (bad argument, bad preset, missing model)."""


def bad_value(field: str, value, allowed: str) -> HfspecError:
    """Build the standard message: field, the value given, and what is allowed."""
    return HfspecError(f"{field}: got {value!r}; allowed: {allowed}")


def first_line(error: BaseException) -> str:
    """An exception as one short line for a message: its type and the first line of its text (200 characters)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:200]}" if text else type(error).__name__
