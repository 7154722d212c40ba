# The two commands of README.md, each running the idempotent set-up first.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTEST_ARGS ?=

.PHONY: help setup demo test test-fast lint bench clean

help:
	@echo "make demo       # main job: fleet demo on real vLLM (CPU) with the bundled model"
	@echo "make test       # the whole test suite (real rclpy nodes, real vLLM engine)"
	@echo "make test-fast  # without the engine-loading tests"
	@echo "make setup      # set-up only (idempotent; also run by demo and test)"
	@echo "make lint       # ruff"

setup:
	@scripts/setup.sh

demo: setup
	@. ./env.sh && python -m timelyllm_ros.demo $(DEMO_ARGS)

test: setup
	@. ./env.sh && python -m pytest -q $(PYTEST_ARGS)

test-fast: setup
	@. ./env.sh && python -m pytest -q -m "not engine" $(PYTEST_ARGS)

lint: setup
	@. ./env.sh && ruff check .

bench: setup
	@. ./env.sh && timelyllm-bench sim --workload wid2

clean:
	rm -rf build install log env.sh
