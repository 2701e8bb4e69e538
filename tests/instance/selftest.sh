#!/bin/sh
# Self-test of boot.py, without the control plane: boots the rendered infra/cloud-init/node.yaml three times in
# namespaces against a local HTTPS server that serves target/debug/dataplane (stop, kill, dataplane exit), and
# checks that nothing is left behind. Root only; about 10-30 s. PYTHON=... to pick the interpreter.
exec "${PYTHON:-python3}" "$(dirname "$0")/boot.py" --selftest "$@"
