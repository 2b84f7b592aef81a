#!/usr/bin/env python3
"""Counts what a tools/test.sh tier ran: passed, failed and skipped cases.

    test_summary.py RESULTS_DIR

RESULTS_DIR holds the XML reports of one tier, each read the same way:
  ctest.xml      ctest's --output-junit: one <testcase> per ctest test (one
                 per GoogleTest case, one per script suite such as full_disk,
                 one per pytest run);
  pytest/*.xml   pytest's --junitxml of each Python suite, named after its
                 ctest test (python_load.xml ...): these replace that test's
                 single entry in ctest.xml with its cases;
  gtest/*.xml    --gtest_output=xml of the sanitizer runs;
  extra.tsv      one line per case run outside those (fuzz targets, bench
                 smoke runs): name, passed|failed|skipped, why.
A skip is never a pass: every skipped case is listed with its reason, and
the last line counts the three apart. Exits 1 when any case failed or when
there were no cases at all.
"""
import glob
import os
import sys
import xml.etree.ElementTree as ET


def outcome(case):
    """passed, failed or skipped, and a reason for the last two."""
    for tag in ("failure", "error"):
        node = case.find(tag)
        if node is not None:
            return "failed", (node.get("message") or node.text or "").strip()
    status = case.get("status", "")
    result = case.get("result", "")
    if status == "fail":
        return "failed", "ctest reported a failure"
    skipped = case.find("skipped")
    if skipped is not None or result == "skipped" or status in ("notrun", "disabled"):
        why = ""
        if skipped is not None:
            why = (skipped.get("message") or skipped.text or "").strip()
        if why == "SKIP_REGULAR_EXPRESSION_MATCHED":  # ctest's word for a GTEST_SKIP
            why = ""
        out = case.find("system-out")
        if not why and out is not None and out.text:
            # GoogleTest prints the reason given to GTEST_SKIP() on the line
            # after "Skipped"; ctest's JUnit keeps the output.
            lines = [l.strip() for l in out.text.splitlines() if l.strip()]
            for i, line in enumerate(lines):
                if "Skipped" in line and i + 1 < len(lines):
                    why = lines[i + 1]
                    break
            if not why:
                why = next((l for l in lines if "SKIP" in l or "skipped" in l), "")
        return "skipped", why or status or "skipped"
    return "passed", ""


def cases(path):
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        suite = case.get("classname", "")
        name = case.get("name", "")
        yield (f"{suite}.{name}" if suite and suite != name else name), case


def main():
    results = sys.argv[1]
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    listed = {"failed": [], "skipped": []}
    disabled = []

    def add(name, state, why):
        counts[state] += 1
        if state != "passed":
            listed[state].append((name, why))

    pytest_runs = {os.path.splitext(os.path.basename(p))[0]: p
                   for p in glob.glob(os.path.join(results, "pytest", "*.xml"))}
    ctest_xml = os.path.join(results, "ctest.xml")
    if os.path.exists(ctest_xml):
        for name, case in cases(ctest_xml):
            if case.get("status") == "disabled":
                disabled.append(name)  # DISABLED_: a child process's entry point, not a case
                continue
            state, why = outcome(case)
            if name in pytest_runs and state != "failed":
                continue  # counted case by case below
            if name in pytest_runs:
                why = f"the pytest run failed (its cases are counted below): {why}"[:300]
            add(name, state, why)
    for run, path in sorted(pytest_runs.items()):
        for name, case in cases(path):
            state, why = outcome(case)
            add(f"{run}: {name}", state, why)
    for path in sorted(glob.glob(os.path.join(results, "gtest", "*.xml"))):
        label = os.path.splitext(os.path.basename(path))[0]
        for name, case in cases(path):
            if case.get("status") == "notrun":
                continue  # filtered out (or DISABLED_): not run, not a case of this tier
            state, why = outcome(case)
            add(f"{label}: {name}", state, why)
    extra = os.path.join(results, "extra.tsv")
    if os.path.exists(extra):
        with open(extra) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) >= 2:
                    add(parts[0], parts[1], parts[2] if len(parts) > 2 else "")

    if disabled:
        print(f"== not cases (DISABLED_, run only as child processes): {', '.join(disabled)}")
    for state in ("skipped", "failed"):
        if listed[state]:
            print(f"== {state} ({len(listed[state])}):")
            for name, why in listed[state]:
                print(f"   {name}" + (f" -- {why.splitlines()[0][:200]}" if why else ""))
    total = sum(counts.values())
    print(f"== test.sh: {total} cases: {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['skipped']} skipped")
    if total == 0:
        print("== test.sh: no cases ran at all", file=sys.stderr)
        return 1
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
