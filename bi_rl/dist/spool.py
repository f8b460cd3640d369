"""Finished samples between ranks and on disk before they can join the log.

A data-parallel rollout's log (bi_rl.rollout.schema) is written by rank 0 alone, in
canonical order, chained exactly as one process chains it. Samples reach rank 0 in
whatever order the ranks finish them, so a sample whose predecessors are not all in the
log yet waits. So that a killed run loses none of them, the waiting samples are appended
to a spool beside the log, LOG.pending (append-only, flushed per batch), from the moment
the log itself is in place (a new log appears with its first records):

    line 1   the log's header line, byte for byte (the spool belongs to that run)
    then     one sample per line: {"unit", "tokens", "logprob_bits", "fingerprints",
             "finish", "stop", "check"}, where unit = prompt_index * n + sample and check
             is blake2b-64 over the other fields (a torn or edited line is found)

A resumed run reads the log and the spool; every unit found in either is done, the log is
extended from the spool where the spool continues it, and the rest is split among the
ranks. A finished run deletes the spool: LOG.pending exists only beside an incomplete log.
The same JSON form (`encode`, `decode`) carries samples from the other ranks to rank 0.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import orjson

from bi_rl.rollout.engine import Sample
from bi_rl.rollout.prompts import Prompt
from bi_rl.rollout.schema import LogError, RunHeader, canon, differing_fields

__all__ = ["Spool", "decode", "encode", "spool_path"]

_FIELDS = ("unit", "tokens", "logprob_bits", "fingerprints", "finish", "stop")


def spool_path(log) -> Path:
    """LOG.pending: the samples a distributed run made but could not append yet."""
    log = Path(log)
    return log.with_name(log.name + ".pending")


def _check(obj: dict) -> str:
    h = hashlib.blake2b(digest_size=8, person=b"bi-rl/pending")
    h.update(canon([obj[k] for k in _FIELDS]))
    return h.hexdigest()


def _to_json(s: Sample, n: int) -> dict:
    obj = {
        "unit": s.prompt_index * n + s.sample,
        "tokens": list(s.tokens),
        "logprob_bits": list(s.logprob_bits),
        "fingerprints": list(s.fingerprints),
        "finish": s.finish,
        "stop": s.stop,
    }
    obj["check"] = _check(obj)
    return obj


def _from_json(obj, prompts: Sequence[Prompt], n: int, where: str) -> Sample:
    """The Sample a JSON object holds, its form and check verified; ValueError names where."""
    if not isinstance(obj, dict) or any(k not in obj for k in (*_FIELDS, "check")):
        raise ValueError(f"{where}: not a sample (needs {', '.join(_FIELDS)}, check)")
    if _check(obj) != obj["check"]:
        raise ValueError(f"{where}: check failed (the sample was altered or torn)")
    unit, toks = obj["unit"], obj["tokens"]
    if not (type(unit) is int and 0 <= unit < len(prompts) * n):
        raise ValueError(f"{where}: unit {unit!r} is outside this run")
    if not (len(toks) == len(obj["logprob_bits"]) == len(obj["fingerprints"]) > 0):
        raise ValueError(f"{where}: tokens, logprob_bits and fingerprints differ in length")
    if obj["finish"] not in ("stop", "length"):
        raise ValueError(f"{where}: finish {obj['finish']!r} is neither stop nor length")
    p_index, k = divmod(unit, n)
    p = prompts[p_index]
    return Sample(
        prompt_index=p_index,
        prompt_id=p.id,
        sample=k,
        prompt_tokens=p.tokens,
        tokens=list(toks),
        logprob_bits=list(obj["logprob_bits"]),
        fingerprints=list(obj["fingerprints"]),
        finish=obj["finish"],
        stop=obj["stop"],
    )


def encode(samples: Iterable[Sample], n: int) -> bytes:
    """Samples as the bytes one rank sends another."""
    return orjson.dumps([_to_json(s, n) for s in samples])


def decode(data: bytes, prompts: Sequence[Prompt], n: int, sender: str) -> list[Sample]:
    """The samples `encode` wrote; ValueError naming the sender if they do not check."""
    if not data:
        return []
    objs = orjson.loads(data)
    return [_from_json(o, prompts, n, f"a sample from {sender}") for o in objs]


class Spool:
    """LOG.pending, opened for appending (created on the first sample that must wait)."""

    def __init__(self, log, header: RunHeader, n: int):
        self.path = spool_path(log)
        self.header_line = canon(header.to_json()) + b"\n"
        self.n = n
        self._f = None

    def read(self, header: RunHeader, prompts: Sequence[Prompt]) -> dict[int, Sample]:
        """The samples a killed run left here (a torn last line is dropped), by unit.

        Raises LogError when the spool belongs to another run or a line fails its check.
        """
        if not self.path.exists():
            return {}
        data = self.path.read_bytes()
        cut = data.rfind(b"\n") + 1
        if cut == 0:  # not even a whole header line: nothing was spooled
            self.path.unlink()
            return {}
        lines = data[:cut].splitlines()
        try:
            old = RunHeader.from_json(orjson.loads(lines[0]), self.path)
        except orjson.JSONDecodeError:
            raise LogError(self.path, 1, "not a bi-rl spool header") from None
        ignore = ("model_path",)
        a, b = old.to_json(), header.to_json()
        for h in (a, b):
            h["env"] = {k: v for k, v in h["env"].items() if k not in ignore}
        diff = [d for d in differing_fields(a, b) if d not in ("digest", "genesis")]
        if diff:
            raise LogError(
                self.path,
                1,
                f"belongs to another run (header differs in {', '.join(diff)}); "
                "remove it to start again",
            )
        out: dict[int, Sample] = {}
        for lineno, raw in enumerate(lines[1:], start=2):
            try:
                s = _from_json(orjson.loads(raw), prompts, self.n, "sample")
            except (orjson.JSONDecodeError, ValueError) as e:
                raise LogError(
                    self.path, lineno, f"{e}; remove the line (or the file) to regenerate it"
                ) from None
            out[s.prompt_index * self.n + s.sample] = s
        if cut < len(data):
            with open(self.path, "r+b") as f:
                f.truncate(cut)
        self.header_line = lines[0] + b"\n"
        return out

    def append(self, samples: Sequence[Sample]) -> None:
        """Append samples and flush them to the OS."""
        if not samples:
            return
        if self._f is None:
            fresh = not self.path.exists()
            self._f = open(self.path, "ab")  # noqa: SIM115 - closed in close()
            if fresh:
                self._f.write(self.header_line)
        self._f.write(b"".join(canon(_to_json(s, self.n)) + b"\n" for s in samples))
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def remove(self) -> None:
        """Delete the spool (every sample in it is in the log, or the run starts afresh)."""
        self.close()
        self.path.unlink(missing_ok=True)
