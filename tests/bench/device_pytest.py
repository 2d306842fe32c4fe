"""pytest over the device-path tests, surviving one named upstream crash.

On lavapipe from Mesa before 25 (Debian 12's 22.3), a process that runs gemma4 graphs with every layer
on the device dies of SIGSEGV inside lavapipe's queue thread (tests/fixtures/device.py has the details
and a reproduction). A crash takes pytest down with every test after it, so this runs pytest -vv
(every skip prints its reason as it happens: a crashed process never prints its summary), and when
pytest dies of SIGSEGV on such a Mesa, reports the test that was running as skipped with that cause
and runs the remaining ones in a new process. Any other crash, failure or error fails the run.
A failure's traceback is printed when it happens (this module is also loaded into pytest as a plugin,
`-p device_pytest`): pytest prints them at the end, and a later crash would take them with it.

    python tests/bench/device_pytest.py TEST_ID_OR_FILE... [-- PYTEST_ARGS...]   # from the repository root

Used by tests/bench/vulkan_check.sh. Prints pytest's output and one summary line per outcome; exit
status 0 when nothing failed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from fixtures.device import SIGSEGV_EXITS, lavapipe_crash_reason  # noqa: E402

# pytest -vv: "ID PASSED [ 42%]", "ID SKIPPED (reason) ..." (a long reason is cut to the terminal width)
RESULT = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)")


def collect(targets: list[str], extra: list[str]) -> list[str]:
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          *targets, *extra], capture_output=True, text=True)
    ids = [line.strip() for line in res.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if res.returncode not in (0, 5) or not ids:
        sys.stdout.write(res.stdout + res.stderr)
    return ids


def run(ids: list[str], extra: list[str]) -> tuple[int, dict[str, str]]:
    """One pytest process over `ids`: its exit status and the outcome of each test it finished."""
    path = os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "device_pytest",
                             "-vv", "-rfEs", *extra, *ids], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "COLUMNS": "300", "PYTHONPATH": path})  # skip reasons whole
    outcomes: dict[str, str] = {}
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        if (m := RESULT.match(line)) is not None:
            outcomes[m[1]] = m[2]
    return proc.wait(), outcomes


_config = None


def pytest_configure(config) -> None:  # as the plugin inside pytest
    global _config
    _config = config


def pytest_runtest_logreport(report) -> None:  # as the plugin inside pytest: a failure's traceback now
    terminal = _config.pluginmanager.get_plugin("terminalreporter") if _config is not None else None
    if report.failed and terminal is not None:
        terminal.write_line("")
        terminal.write_line(f"device_pytest: {report.nodeid} failed ({report.when}):")
        terminal.write_line(report.longreprtext, flush=True)


def main(argv: list[str]) -> int:
    targets, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    remaining = collect(targets, extra)
    if not remaining:
        print("device_pytest: nothing collected")
        return 1
    outcomes: dict[str, str] = {}
    crashed: list[str] = []
    failed_run = False
    while remaining:
        rc, done = run(remaining, extra)
        outcomes.update(done)
        if rc not in SIGSEGV_EXITS:
            failed_run = rc not in (0, 5)
            break
        victim = next((t for t in remaining if t not in done), None)
        reason = lavapipe_crash_reason(rc)
        if victim is None or reason is None:
            print(f"device_pytest: pytest died of SIGSEGV (not the named lavapipe crash) after {len(done)} tests")
            failed_run = True
            break
        print(f"device_pytest: {victim} SKIPPED: the process died: {reason}")
        outcomes[victim] = "SKIPPED"
        crashed.append(victim)
        remaining = remaining[remaining.index(victim) + 1:]
    counts: dict[str, int] = {}
    for outcome in outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    print("device_pytest: " + ", ".join(f"{n} {k.lower()}" for k, n in sorted(counts.items()))
          + (f" ({len(crashed)} of the skipped: lavapipe crash)" if crashed else ""))
    bad = [t for t, o in outcomes.items() if o in ("FAILED", "ERROR")]
    return 1 if bad or failed_run else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
