"""A bucket read with credentials or an endpoint that do not work (#64.3):
usage: check_bucket_hint.py URL CACHE WORD...

clipshard.Loader(URL, cache_dir=CACHE) raises one ValueError (no
traceback of boto3's, one line) holding every WORD: what to set
(AWS_ACCESS_KEY_ID, AWS_PROFILE, AWS_ENDPOINT_URL). Prints "ok: ..."."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import clipshard  # noqa: E402

url, cache, words = sys.argv[1], sys.argv[2], sys.argv[3:]
try:
    clipshard.Loader(url, epochs=[0], batch_size=4, cache_dir=cache, cache_limit="1GiB")
except ValueError as e:
    msg = str(e)
    assert "\n" not in msg and all(w in msg for w in words), (words, msg)
    print("ok: " + msg)
else:
    raise SystemExit("read %s without working credentials or endpoint" % url)
