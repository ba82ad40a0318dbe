"""Helpers the GPU check scripts share: PASS/FAIL lines and kern serve's /metrics as numbers."""
import httpx

fails = []


def check(name, ok, detail=""):
    """Prints a PASS or FAIL line; a failure is remembered in `fails`."""
    print(("PASS " if ok else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not ok:
        fails.append(name)


def metrics(base):
    """The unlabelled `kern:` samples of BASE/metrics, name → value."""
    out = {}
    for line in httpx.get(base + "/metrics").text.splitlines():
        if line.startswith("kern:") and " " in line and "{" not in line:
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out
