# Two set-up commands (README): `make demo` runs the main job, `make test` the whole suite.
# Each creates or reuses .venv; only Python 3.11 and pip are assumed.
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= out/report

.PHONY: demo test venv system

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[notebook,test]'
	touch $@

venv: $(VENV)/.installed

system:
	./.ci/system-deps.sh

demo: venv system
	$(VENV)/bin/engram-viz layout --config v41-flash
	$(VENV)/bin/engram-viz report --out $(OUT)

test: venv system
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q
