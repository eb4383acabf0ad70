"""What the Python bench scripts share (bench/bench_*.py import it: a
script's folder is first on sys.path)."""
import numpy as np


def span(xs, fmt):
    """median (min–max) of xs, each formatted by fmt; one value alone."""
    xs = sorted(xs)
    if len(xs) == 1:
        return fmt % xs[0]
    return "%s (%s–%s)" % (fmt % float(np.median(xs)), fmt % xs[0], fmt % xs[-1])
