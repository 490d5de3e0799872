# netwarden — `make run` (the demo) and `make test` both bootstrap .venv themselves.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench lint check-presets docker image clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $$(scripts/find-python) -m venv $(VENV)
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

# The engine is installed from Debian's packages and started when missing (root only);
# without one, container tests skip with the reason printed (CI sets NETWARDEN_REQUIRE_DOCKER=1).
docker:
	@scripts/ensure-docker || echo "make: no docker engine; container tests will skip (see above)"

image: $(STAMP) docker
	@$(VENV)/bin/netwarden image build

run: $(STAMP) docker
	@echo "== policy verdicts (agent-default preset, no DNS): exit 3 means some were denied"
	@$(VENV)/bin/netwarden policy check --preset agent-default \
		api.anthropic.com pypi.org evil.example 0xA9FEA9FE '[::ffff:127.0.0.1]' api.openai.com:8443; \
		test $$? -eq 3
	@echo
	@$(PY) -m gateway.demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

check-presets: $(STAMP)
	$(VENV)/bin/netwarden policy lint presets/*.yaml
	$(VENV)/bin/netwarden policy test presets/*.yaml

test: lint check-presets docker
	$(VENV)/bin/pytest -q -m "not bench"

bench: $(STAMP)
	$(VENV)/bin/pytest -q -m bench -p no:randomly --benchmark-disable-gc tests/bench
	$(PY) -m bench.load

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
