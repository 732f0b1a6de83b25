# Every target creates .venv if missing and installs what it needs.
# torch is pinned first: the CPU wheel of 2.13.0 is on these machines; a looser
# spec would pull a multi-GB CUDA build.
PY := .venv/bin/python
PIP := .venv/bin/pip
STAMP := .venv/.installed

.PHONY: demo test test-deps lint clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -d .venv || python3 -m venv .venv
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m tensoropt.demo

# What the tests need outside .venv (Debian's chromium for tests/browser/): installed with
# apt-get when running as root, otherwise a message naming the command.
test-deps:
	scripts/install_test_deps.sh

# PYTEST_ARGS narrows the run, e.g. `make test PYTEST_ARGS=tests/browser`.
test: $(STAMP) test-deps
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	.venv/bin/ruff check .

clean:
	rm -rf .venv build *.egg-info out
