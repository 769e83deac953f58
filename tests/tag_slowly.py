"""``python -m serve tag`` with every model batch slowed down, so that a test can kill the run in the middle.

Usage: ``python tests/tag_slowly.py SECONDS [--ray ADDRESS] TAG-ARGUMENTS...``. Every model call sleeps SECONDS
first: in this process (local engine), or, with ``--ray``, in the model actors of the Ray cluster at ADDRESS
(through Ray's ``worker_process_setup_hook``; ``tests/`` must be on the workers' ``PYTHONPATH``), which this
process joins as the driver.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

DELAY_VARIABLE = "SPML_TEST_BATCH_DELAY"


def slow_down() -> None:
    """Make every model call of this process sleep ``$SPML_TEST_BATCH_DELAY`` seconds first."""
    from serve.predictor import Predictor

    delay = float(os.environ[DELAY_VARIABLE])
    original = Predictor.scores_from_inputs

    def slow(self: Predictor, batch):  # type: ignore[no-untyped-def]
        time.sleep(delay)
        return original(self, batch)

    Predictor.scores_from_inputs = slow  # type: ignore[method-assign]


def run_until_journaled(
    args: list[str], output: Path, records: int, env: dict[str, str], timeout: float = 300
) -> list[dict]:
    """Run this script with ``args``; kill it (SIGKILL) as soon as the journal of ``output`` holds ``records``
    results. Returns the results the journal holds after the kill (complete lines only)."""
    from serve.tagging.journal import journal_path

    journal = journal_path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(output.with_name("killed-run.log"), "w") as log:
        proc = subprocess.Popen([sys.executable, __file__, *args], env=env, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        try:
            while len(_journaled(journal)) < records:
                if proc.poll() is not None:
                    raise AssertionError(f"the run ended (exit {proc.returncode}) before the kill: see {log.name}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"nothing journaled in {timeout} s: see {log.name}")
                time.sleep(0.02)
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
    return _journaled(journal)


def _journaled(journal: Path) -> list[dict]:
    """The results in a journal (complete lines after the header)."""
    if not journal.is_file():
        return []
    lines = journal.read_bytes().split(b"\n")[1:-1]  # the last piece is empty or cut short
    return [rec for rec in map(json.loads, lines) if "scores" in rec]


def main(argv: list[str]) -> int:
    """Run ``serve tag`` with the slowed-down model calls; returns its exit status."""
    os.environ[DELAY_VARIABLE] = argv[0]
    args = argv[1:]
    if args[0] == "--ray":
        import ray

        env = {"worker_process_setup_hook": "tag_slowly.slow_down", "env_vars": {DELAY_VARIABLE: argv[0]}}
        ray.init(address=args[1], runtime_env=env, log_to_driver=False)
        args = args[2:]
    else:
        slow_down()
    from serve.__main__ import main as serve_main

    return serve_main(["tag", *args])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
