"""Every distributed check is run by some world: a function of ``(rank, world, gloo)`` in a
checks module (or the worker) that no scenario lists is never called, so the effect it claims
to prove is proven by nothing (ZeRO's allgather_bucket_size check was written and never ran)."""

from __future__ import annotations

import inspect

import worker


def test_every_check_function_is_in_a_scenario():
    listed = {f for checks in worker.SCENARIOS.values() for f in checks}
    modules = [worker] + [
        m for name, m in vars(worker).items() if inspect.ismodule(m) and name.endswith("_checks")
    ]
    for module in modules:
        # the checks modules' fsdp_effect_checks and friends feed fsdp_checks.CHECKS
        modules += [
            m
            for name, m in vars(module).items()
            if inspect.ismodule(m) and name.endswith("_checks") and m not in modules
        ]
    defined = {
        f
        for module in modules
        for f in vars(module).values()
        if inspect.isfunction(f)
        and f.__module__ == module.__name__
        and list(inspect.signature(f).parameters)[:3] == ["rank", "world", "gloo"]
    }
    assert len(defined) > 50, len(defined)
    unlisted = sorted(f"{f.__module__}.{f.__name__}" for f in defined - listed)
    assert not unlisted, f"checks no scenario runs: {unlisted}"
