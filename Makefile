# HPwsn developer commands. On a fresh Debian 12 (as root) `make run` and
# `make test` install everything they need themselves (apt + .venv).
#
#   make run                     run redis + web + worker + beat in the foreground
#   make test [ARGS="-k foo"]    ruff + pytest against PostgreSQL and Redis
#   make superuser               create an admin login
#   make bench [ARGS=...]        end-to-end benchmark (python -m bench.e2e; starts its own platform)
#   make lint | typecheck        ruff (check + format --check) | mypy
#   make clean                   remove var/ and .venv/

SHELL := /bin/bash
.DEFAULT_GOAL := help
ARGS ?=

.PHONY: help run test venv superuser bench lint typecheck clean

help:
	@sed -n 's/^#   /  /p' $(firstword $(MAKEFILE_LIST))

run:
	@bash scripts/run.sh

test:
	@bash scripts/test.sh $(ARGS)

venv:
	@bash scripts/lib.sh hp_ensure_venv

superuser: venv
	@bash scripts/lib.sh hp_manage migrate --noinput
	@bash scripts/lib.sh hp_manage createsuperuser $(ARGS)

bench: venv
	.venv/bin/python -m bench.e2e $(ARGS)

lint: venv
	.venv/bin/ruff check . && .venv/bin/ruff format --check .

typecheck: venv
	.venv/bin/mypy $(ARGS)

clean:
	rm -rf var/ .venv/
