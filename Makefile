# Every target creates .venv if missing and installs what it needs.
# torch is pinned first: the CPU wheel of 2.13.0 is on these machines; a looser
# spec would pull a multi-GB CUDA build.
PY := .venv/bin/python
PIP := .venv/bin/pip
STAMP := .venv/.installed

.PHONY: demo test lint clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -d .venv || python3 -m venv .venv
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m tensoropt.demo

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	.venv/bin/ruff check .

clean:
	rm -rf .venv build *.egg-info out
