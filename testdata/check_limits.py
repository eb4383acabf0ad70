"""The Python reader's limits (#63): no file of python/clipshard above
FILE lines, no class above CLASS, no function or method above FUNC
(nested ones included). Prints one line a breach; exit status 1 if any.

    python3 testdata/check_limits.py python/clipshard
"""
import ast
import os
import sys

FILE, CLASS, FUNC = 500, 250, 80


def sizes(pkg):
    """{what: lines} of every file, class and function of pkg."""
    out = {}
    for name in sorted(os.listdir(pkg)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(pkg, name), encoding="utf-8") as f:
            text = f.read()
        out[name] = len(text.splitlines())
        mod = name[:-3]

        def walk(node, prefix):
            for n in ast.iter_child_nodes(node):
                if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    kind = "class" if isinstance(n, ast.ClassDef) else "def"
                    what = "%s.%s" % (prefix, n.name)
                    out["%s %s" % (kind, what)] = n.end_lineno - n.lineno + 1
                    walk(n, what)
        walk(ast.parse(text, name), mod)
    return out


def limit(what):
    return FILE if what.endswith(".py") else CLASS if what.startswith("class ") else FUNC


def main(pkg):
    got = sizes(pkg)
    bad = ["%s: %d lines, over the limit %d" % (what, n, limit(what)) for what, n in sorted(got.items()) if n > limit(what)]
    for line in bad:
        print(line)
    print("checked %d files, classes and functions of %s: %d over the limits (%d, %d, %d lines)" % (
        len(got), pkg, len(bad), FILE, CLASS, FUNC))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "python/clipshard"))
