#!/usr/bin/env python3
"""Print the Kubernetes objects of YAML files as one JSON list.

    python3 testdata/k8s_docs.py FILE.yaml...

Used by cmd/convert's test of docs/scaling/*-job.yaml, which runs the
Jobs' containers locally as Kubernetes would start them. Needs PyYAML
(Debian: python3-yaml).
"""
import json
import sys

import yaml

docs = []
for path in sys.argv[1:]:
    with open(path) as f:
        docs.extend(d for d in yaml.safe_load_all(f) if d)
json.dump(docs, sys.stdout)
