"""Reward functions: the embedded addition task's, or a user's named on the command line.

A reward function scores one sample. It is called with those of these keyword arguments
it names (all of them if it takes **kwargs), and returns a number:

    def reward(prompt: str, completion: str, finish: str, row: dict, tokens: list) -> float

prompt      the prompt text (the prompt file's field, or the decoded prompt tokens)
completion  the decoded completion without the stop token that ended it
finish      "stop" (it ended on a stop token or string) or "length" (it hit max_tokens)
row         the prompt's row from the prompt file (e.g. an "answer" field), else {}
tokens      the completion's token ids, without the stop token that ended it

`load_reward(spec)` finds one from "module:function" (imported as a module, e.g.
"my_rewards:accuracy") or "path/to/file.py:function" (loaded from that file); None is the
default, `addition_reward`: the addition task's shaped reward (1 for the exact sum followed
by the end-of-sequence token, partial credit for a well-formed answer with right digits),
with the answer computed from the prompt, so any prompt set of "a+b=" problems works.

Every problem raises RewardError with one line naming the spec and what is wrong; a reward
that is not a finite number is refused naming the sample.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import sys
from collections.abc import Callable
from pathlib import Path

from bi_rl.tasks.addition import parse_problem, partial_reward

__all__ = ["ARGUMENTS", "RewardError", "addition_reward", "call_reward", "load_reward"]

RewardFn = Callable[..., float]
ARGUMENTS = ("prompt", "completion", "finish", "row", "tokens")


class RewardError(ValueError):
    """A reward function that cannot be found or returned something unusable."""


def addition_reward(prompt: str, completion: str, finish: str) -> float:
    """The addition task's partial_reward; 0.0 for a prompt that is not an addition problem."""
    problem = parse_problem(prompt.strip())
    if problem is None:
        return 0.0
    return partial_reward(problem.answer, completion, finish)


def _from_file(path: Path):
    name = f"bi_rl_reward_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RewardError(f"reward {path}: cannot load it as a Python file")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses and pickling look a module up by name
    spec.loader.exec_module(mod)
    return mod


def load_reward(spec: str | None) -> RewardFn:
    """The reward function named by `spec` ("module:function" or "file.py:function")."""
    if spec is None:
        return addition_reward
    where, colon, name = spec.rpartition(":")
    if not colon or not where or not name.isidentifier():
        raise RewardError(f"reward {spec!r}: expected module:function or path/to/file.py:function")
    try:
        if where.endswith(".py"):
            path = Path(where).expanduser()
            if not path.is_file():
                raise RewardError(f"reward {spec!r}: no such file {where}")
            mod = _from_file(path)
        else:
            mod = importlib.import_module(where)
    except RewardError:
        raise
    except Exception as e:  # the user's module failed to import: name it on one line
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise RewardError(f"reward {spec!r}: importing {where} failed ({reason})") from None
    fn = getattr(mod, name, None)
    if fn is None:
        raise RewardError(f"reward {spec!r}: {where} has no attribute {name!r}")
    if not callable(fn):
        raise RewardError(f"reward {spec!r}: {name} is not callable")
    _wanted(fn, spec)
    return fn


def _wanted(fn: RewardFn, spec: str | None = None) -> tuple[str, ...]:
    """The ARGUMENTS `fn` takes (all with **kwargs); refuses a required parameter beyond them."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ARGUMENTS
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return ARGUMENTS
    names = tuple(p.name for p in params if p.name in ARGUMENTS)
    for p in params:
        required = p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        if required and (p.name not in ARGUMENTS or p.kind is p.POSITIONAL_ONLY):
            raise RewardError(
                f"reward {spec or fn!r}: parameter {p.name!r} is not one bi-train passes "
                f"(it passes {', '.join(ARGUMENTS)} by keyword)"
            )
    return names


def call_reward(fn: RewardFn, label: str, **kwargs) -> float:
    """fn(the ARGUMENTS it takes) as a float, refusing anything but a finite real number."""
    value = fn(**{k: kwargs[k] for k in _wanted(fn)})
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)  # numpy and mlx scalars
        except (TypeError, ValueError):
            raise RewardError(
                f"the reward for {label} is {type(value).__name__}, not a number"
            ) from None
    if not math.isfinite(value):
        raise RewardError(f"the reward for {label} is {value}, not a finite number")
    return float(value)
