"""A tiny `raises` for checks that run inside worker processes (no pytest there)."""


def raises(kind, text, fn):
    try:
        fn()
    except kind as error:
        assert text in str(error), f"{kind.__name__} without {text!r}: {error}"
        return
    raise AssertionError(f"expected {kind.__name__} containing {text!r}")
