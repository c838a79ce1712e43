#!/usr/bin/env python3
"""Plain test runner (no pytest): runs the TESTS lists of the given modules,
prints one line per test and a closing "N passed, N failed, N skipped".

    python3 python/tests/runner.py [test_pure] [test_device] [--json FILE] [--only SUBSTR]

A test is a function that returns a short result string (or None), raises
Skip("why") to skip, and fails on any other exception.
"""
import argparse
import importlib
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # the kvq_torch package


class Skip(Exception):
    pass


if __name__ == "__main__":  # test modules import Skip from "runner": one class, not two
    sys.modules["runner"] = sys.modules[__name__]


def _save(path, results):
    if path:
        n = {s: sum(r["status"] == s for r in results) for s in ("pass", "fail", "skip")}
        with open(path, "w") as f:
            json.dump({"results": results, "summary": n}, f, indent=1, default=str)


def run(modules, only=None, json_path=None):
    """Runs the tests; with json_path the results so far are saved after every
    test, so a run killed by a timeout keeps what finished."""
    results = []
    for name in modules:
        try:
            mod = importlib.import_module(name)
        except Skip as e:
            print(f"SKIP {name}: {e}", flush=True)
            results.append({"test": name, "status": "skip", "detail": str(e)})
            continue
        setup = getattr(mod, "setup", None)
        if setup is not None:
            try:
                setup()
            except Skip as e:
                print(f"SKIP {name}: {e}", flush=True)
                results.append({"test": name, "status": "skip", "detail": str(e)})
                continue
        for fn in mod.TESTS:
            tname = f"{name}.{fn.__name__}"
            if only and only not in tname:
                continue
            t0 = time.perf_counter()
            try:
                detail = fn()
                status = "pass"
            except Skip as e:
                detail, status = str(e), "skip"
            except Exception as e:  # noqa: BLE001 - every failure is reported, the run goes on
                detail, status = f"{type(e).__name__}: {e}", "fail"
                traceback.print_exc()
            dt = time.perf_counter() - t0
            line = {"pass": "PASS", "skip": "SKIP", "fail": "FAIL"}[status]
            print(f"{line} {tname} ({dt:.1f} s){': ' + str(detail) if detail else ''}", flush=True)
            r = {"test": tname, "status": status, "seconds": round(dt, 3)}
            if isinstance(detail, dict):
                r.update(detail)
            else:
                r["detail"] = detail
            results.append(r)
            _save(json_path, results)
    return results


def main():
    p = argparse.ArgumentParser()
    p.add_argument("modules", nargs="*", default=["test_pure"])
    p.add_argument("--json")
    p.add_argument("--only")
    a = p.parse_args()
    results = run(a.modules, a.only, a.json)
    _save(a.json, results)
    n = {s: sum(r["status"] == s for r in results) for s in ("pass", "fail", "skip")}
    print(f"{n['pass']} passed, {n['fail']} failed, {n['skip']} skipped", flush=True)
    return 1 if n["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
