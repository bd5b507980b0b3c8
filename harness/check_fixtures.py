"""Every case the oracles define has its recorded fixture, and every fixture a case: the
conformance suite reads whatever fixtures are there, so a case never recorded would silently
go unchecked (five were, until 2026-11-27). Needs no torch (the case tables only); exit 1
naming what is missing or stale.

    python3 harness/check_fixtures.py
"""
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cases  # noqa: E402
import common  # noqa: E402

ORACLES = [  # (the cases, the fixture directory they record to, the script that records them)
    (cases.all_cases(), "fsdp2", "harness/fsdp2_oracle.py"),
    (cases.fake_cases(), "fsdp2_fake", "harness/fsdp2_fake.py"),
    (cases.fsdp1_cases(), "fsdp1", "harness/fsdp1_oracle.py"),
    (cases.fsdp1_fake_cases(), "fsdp1_fake", "harness/fsdp1_fake.py"),
]


def main():
    problems = []
    expected = set()
    for table, subdir, script in ORACLES:
        for name, case in table.items():
            path = common.fixture_path(name, case, subdir)
            expected.add(os.path.normpath(path))
            if not os.path.exists(path):
                problems.append(f"missing {os.path.relpath(path, common.REPO)}: .venv/bin/python {script} {name}")
    dirs = {os.path.dirname(p) for p in expected}
    for d in sorted(dirs):
        for path in sorted(glob.glob(os.path.join(d, "*.json"))):
            if os.path.normpath(path) not in expected:
                problems.append(f"stale {os.path.relpath(path, common.REPO)}: no case records it (bash harness/regen.sh removes it)")
    for name in sorted(glob.glob(os.path.join(common.MODELS_DIR, "*.config.json"))):
        n = os.path.basename(name)[: -len(".config.json")]
        if not os.path.exists(os.path.join(common.FIXTURES, "hf_params", f"{n}.json")):
            problems.append(f"missing tests/fixtures/hf_params/{n}.json: .venv/bin/python harness/hf_params.py {n}")
    if problems:
        print("\n".join(problems))
        sys.exit(1)
    print(f"every case has its fixture and every fixture a case ({len(expected)} cases, hf_params for every config)")


if __name__ == "__main__":
    main()
