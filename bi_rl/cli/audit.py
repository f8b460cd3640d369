"""bi-audit: verify rollout logs by hash, compare two logs, re-derive sampled tokens.

    bi-audit run.jsonl                   # integrity: header digest, hash chain, records
    bi-audit a.jsonl b.jsonl             # the same run twice (two machines, two batch sizes):
                                         # identical, or the first record and token that differ
    bi-audit run.jsonl --model [DIR]     # also re-derive every token from its key and the
                                         # model's logits (DIR: default the header's model)
    python -m bi_rl.cli.audit --help

Exit status: 0 every check passed (and two logs are identical); 1 a check failed or the
logs differ, the message naming the first failing line, record and token; 2 the model
cannot be used.
"""

from __future__ import annotations

import argparse
import os
import sys

from bi_rl.cli import default_log_missing, settings_refused

PROG = "bi-audit"
EXIT_OK, EXIT_FAIL, EXIT_ERROR = 0, 1, 2
AUTO = "<header>"


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Audit bi-rl rollout logs. With one LOG: verify its header digest, hash "
        "chain, record order and count. With two: also compare them hash for hash. With "
        "--model: also re-derive each sampled token, logprob and logit fingerprint.",
        epilog="Exit status: 0 all checks passed, 1 a check failed or the logs differ, "
        "2 unusable model or arguments.",
    )
    from bi_rl.mode import MODES
    from bi_rl.rollout.engine import DEFAULT_BATCH_SIZE
    from bi_rl.rollout.run import DEFAULT_OUT

    p.add_argument(
        "logs",
        metavar="LOG",
        nargs="*",
        default=[DEFAULT_OUT],
        help=f"one log to verify, or two to compare (default: {DEFAULT_OUT})",
    )
    p.add_argument(
        "--model",
        nargs="?",
        const=AUTO,
        metavar="DIR",
        help="re-derive tokens with this mlx-lm model (without DIR: the model the header names)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help=f"samples per forward pass with --model (default: {DEFAULT_BATCH_SIZE})",
    )
    p.add_argument(
        "--mode",
        choices=MODES,
        help="batch_invariant_mode for the forward passes with --model: strict, fallback or off "
        "(default: the mode the log was made with, from its header)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="re-derive even when the model, tokenizer or backend differs from the header",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    return p


def _rederive(path, args, out: dict, lines: list[str]) -> int:
    from bi_rl.cli import ProgressBar
    from bi_rl.model import Digests, load_model
    from bi_rl.rollout.log import read_header
    from bi_rl.score.audit import rederive
    from bi_rl.score.rescore import header_mismatches, locate_model, log_mode, refuse_mismatches

    header = read_header(path)
    model_dir, name = locate_model(header, None if args.model == AUTO else args.model)
    digests = Digests(model_dir)  # hashed while the model loads and runs; checked below
    model, tokenizer = load_model(model_dir)
    mode = log_mode(header, args.mode)
    bar = ProgressBar("samples re-derived")  # on a terminal only
    try:
        res = rederive(
            path, model, tokenizer, batch_size=args.batch_size, mode=mode, progress=bar.update
        )
    finally:
        bar.finish()
        checks = header_mismatches(header, model_dir, digests=digests)
        refuse_mismatches(checks, args.force, "re-derive")
    out.setdefault("rederive", {})[str(path)] = {"model": name, "mode": mode, **res.to_json()}
    r = res.report
    if res.ok:
        lines.append(
            f"{path}: re-derived with {name} (mode {mode}): {res.tokens_equal}/{res.tokens} "
            f"tokens, {r.equal}/{r.tokens} logprobs and {r.fingerprints_equal}/"
            f"{r.fingerprints_compared} logit fingerprints bitwise equal"
        )
        return EXIT_OK
    if res.first_token_mismatch is not None:
        m = res.first_token_mismatch
        lines.append(
            f"{path}:{m['line']}: record {m['record']} ({m['label']}): token "
            f"{m['token']}: logged token {m['logged']}, but the sampler draws "
            f"{m['derived']} from its key and the model's logits"
        )
    if res.stop_string_problem is not None:
        m = res.stop_string_problem
        lines.append(f"{path}:{m['line']}: record {m['record']} ({m['label']}): {m['message']}")
    d = r.first_divergence or r.first_fingerprint_divergence
    if d is not None:
        lines.append(
            f"{path}:{d.sample + 2}: record {d.sample} ({d.label}): token "
            f"{d.position}: logged logprob {d.rollout_logprob!r} / fingerprint "
            f"{d.rollout_fingerprint}, recomputed {d.rescored_logprob!r} / "
            f"{d.rescored_fingerprint}"
        )
    bad_fp = r.fingerprints_compared - r.fingerprints_equal
    lines.append(
        f"{path}: re-derivation FAILED: {res.tokens - res.tokens_equal} of {res.tokens} tokens, "
        f"{r.differing} logprobs, {bad_fp} fingerprints differ"
    )
    return EXIT_FAIL


def _same_file(a: str, b: str) -> bool:
    """Whether two paths are one file (any spelling, links included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one is missing: the audit names it
        return False


def main(argv=None) -> int:
    parser = setup_arg_parser()
    args = parser.parse_args(argv)
    if len(args.logs) > 2:
        parser.error("give one log to verify or two to compare")
    if len(args.logs) == 1 and default_log_missing(PROG, args.logs[0]):
        return EXIT_ERROR
    if args.model is not None and settings_refused(PROG):  # --model runs the model
        return EXIT_ERROR
    if len(args.logs) == 2 and _same_file(*args.logs):
        print(
            f"{PROG}: error: both LOGs name the same file; give two logs to compare",
            file=sys.stderr,
        )
        return EXIT_ERROR
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import orjson

    from bi_rl.model import ModelError
    from bi_rl.rollout.log import LogError
    from bi_rl.score.audit import audit_log, compare_logs

    out: dict = {}
    lines: list[str] = []
    status = EXIT_OK
    if len(args.logs) == 1:
        res = audit_log(args.logs[0])
        out["audit"] = res.to_json()
        lines.append(res.summary())
        status = EXIT_OK if res.ok else EXIT_FAIL
        audited = [args.logs[0]] if res.ok else []
    else:
        cmp = compare_logs(*args.logs)
        out["compare"] = cmp.to_json()
        for side in (cmp.a, cmp.b):
            lines.append(side.summary())
        if cmp.a.ok and cmp.b.ok:
            lines.append(("IDENTICAL: " if cmp.identical else "DIFFERENT: ") + cmp.message)
            if cmp.env_differences:
                lines.append(
                    "  (environment differs, outside the hash chain: "
                    + ", ".join(cmp.env_differences)
                    + ")"
                )
        status = EXIT_OK if cmp.identical else EXIT_FAIL
        audited = [p for p, s in zip(args.logs, (cmp.a, cmp.b), strict=True) if s.ok]
    if args.model is not None:
        try:
            for path in audited:
                status = max(status, _rederive(path, args, out, lines))
        except (LogError, ModelError, ValueError, NotImplementedError) as e:
            print(f"{PROG}: error: {e}", file=sys.stderr)
            return EXIT_ERROR
    if args.json:
        out["ok"] = status == EXIT_OK
        sys.stdout.write(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        for line in lines:
            print(f"{PROG}: {line}")
    return status


if __name__ == "__main__":
    sys.exit(main())
