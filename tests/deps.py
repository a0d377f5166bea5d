"""Dependencies of the tests that a bare `importorskip` would hide.

av and diffusers are declared in pyproject.toml (diffusers in `dev`): tests import them plainly, so
a missing install fails. decord is declared for x86-64 only (it has no wheel elsewhere): tests that
need it skip on other machines and fail here when it is missing.
"""

import platform

import pytest

DECORD_MACHINE = platform.machine() in ("x86_64", "AMD64")
needs_decord = pytest.mark.skipif(not DECORD_MACHINE, reason="decord has no wheel for this machine")


def skip_module_without_decord() -> None:
    if not DECORD_MACHINE:
        pytest.skip("decord has no wheel for this machine", allow_module_level=True)
