# Two set-up commands (README): `make demo` runs the main job, `make test` the whole suite
# (after `lint` and `typecheck`). Each creates or reuses .venv; only Python 3.11 and pip are assumed.
# `make fast` runs the unit tier alone (seconds), `make lint` the style and layer gates alone,
# `make docs` the documentation site (build/docs/docs/index.html).
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= out/report
LINTED := engram_viz tests notebooks benchmarks

DOCS_OUT ?= build/docs

.PHONY: demo test fast lint typecheck venv system docs

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[notebook,test,docs]'
	touch $@

venv: $(VENV)/.installed

system:
	./.ci/system-deps.sh

demo: venv system
	$(VENV)/bin/engram-viz layout --config v41-flash
	$(VENV)/bin/engram-viz report --out $(OUT)

lint: venv
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/lint-imports

typecheck: venv
	$(VENV)/bin/basedpyright --pythonpath $(PY)

# the site: API from the docstrings, the docs/ pages, the notebooks executed once (cached); offline,
# every warning and every broken cross-reference an error. Open $(DOCS_OUT)/docs/index.html.
docs: venv
	$(PY) -m sphinx -b html -c docs -n -W --keep-going -q -d $(DOCS_OUT)/.doctrees . $(DOCS_OUT)

fast: venv
	$(PY) -m pytest -q -m unit

test: venv system lint typecheck
	$(PY) -m pytest -q
