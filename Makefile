# Two commands for a new user: `make serve` and `make test`. Both go through `make setup`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.setup-stamp
GEN := clients/python/inference/v1
DEFAULT_MODEL := models/SmolLM2-135M-Instruct.Q4_1.gguf
BENCH_MODEL := models/gemma-3-270m-q4_k_m.gguf
BENCH_MODEL_1B := models/tinyllama-shape-1.1b-q4_k_m.gguf
LLAMA_TOOLS := .llama-tools
ARGS ?=
# NOTE: ggml's AMX backend, which -march=native turns on for CPUs with AMX (Sapphire Rapids and newer),
# faults in its first matrix multiply on some virtual machines (llama.cpp issue 20824; seen here on a
# Firecracker VM: a general protection fault in libggml-cpu at the first decode, every model, ours and
# llama-server alike). -mno-amx-int8 hides __AMX_INT8__ from ggml and keeps every other native
# instruction set. Used by the llama-cpp-python build (setup) and by llama-tools alike.
ifeq ($(shell uname -m),x86_64)
LLAMA_CMAKE_ARGS ?= -DCMAKE_C_FLAGS=-mno-amx-int8 -DCMAKE_CXX_FLAGS=-mno-amx-int8
endif
export LLAMA_CMAKE_ARGS

.PHONY: setup serve test unit lint docs stubs templates model bench-model bench-model-1b llama-tools bench bench-env goodput-env soak polyglot semantic postgres netns kubectl clean help

help:
	@echo "make serve   - set up and serve the default model on :50051 (ARGS='--port 6000 ...')"
	@echo "make test    - set up and run the test suite"
	@echo "make bench   - run the benchmarks on the benchmark model (results in bench/results/)"
	@echo "make llama-tools - build llama.cpp's llama-server, llama-batched-bench and llama-quantize (.llama-tools/bin)"
	@echo "make bench-model-1b - build the 1.1B-shape benchmark model (synthetic weights, Q4_K_M, pinned sha256)"
	@echo "make goodput-env - guidellm (the load tool of scenario S) in its own venv .venv-guidellm (bench/requirements-goodput.txt)"
	@echo "make soak    - 10 min of mixed load on one server: RssAnon slope and unexpected errors (ARGS='--minutes 1')"
	@echo "make lint    - ruff, mypy, import-linter (the dependency rule) and buf lint"
	@echo "make docs    - regenerate docs/configuration.md from service/config.py (a test fails when stale)"
	@echo "make polyglot - build and run the Go and Java example clients against a live server"
	@echo "make semantic - install the optional semantic response cache (requirements-semantic.txt)"
	@echo "make postgres - install PostgreSQL 15 for the shared batch store's tests (as root, if missing)"
	@echo "make netns   - install iproute2 for the replicas-as-hosts tests (as root, if missing)"
	@echo "make kubectl - install kubectl for the manifest tests and scripts/check_k8s.sh (as root, if missing)"

setup: $(STAMP) stubs model templates

# NOTE: requirements.lock pins the whole environment; llama-cpp-python builds from source (~5 min once,
# then pip's wheel cache serves it).
$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip==25.3
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) install -r requirements.lock
	$(PY) scripts/check_llama_build.py
	$(MAKE) stubs
	$(PIP) install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

stubs: $(GEN)/inference_pb2.py $(GEN)/batch_pb2.py

# The proto is mapped to inference/v1/inference.proto so the stubs form the package `inference.v1`.
$(GEN)/inference_pb2.py: protos/inference.proto
	mkdir -p $(GEN)
	$(PY) -m grpc_tools.protoc -Iinference/v1=protos --python_out=clients/python \
		--pyi_out=clients/python --grpc_python_out=clients/python protos/inference.proto
	touch clients/python/inference/__init__.py $(GEN)/__init__.py

# NOTE: batch.proto imports "inference.proto" (buf's module root is protos/); for Python it must be
# inference/v1/inference.proto, so both files are staged under build/protos/inference/v1 with the import
# rewritten (compiling only batch.proto: inference_pb2 stays the rule above's).
$(GEN)/batch_pb2.py: protos/batch.proto protos/inference.proto $(GEN)/inference_pb2.py
	rm -rf build/protos && mkdir -p build/protos/inference/v1
	cp protos/inference.proto build/protos/inference/v1/
	sed 's|^import "inference.proto";|import "inference/v1/inference.proto";|' protos/batch.proto \
		> build/protos/inference/v1/batch.proto
	$(PY) -m grpc_tools.protoc -Ibuild/protos --python_out=clients/python --pyi_out=clients/python \
		--grpc_python_out=clients/python build/protos/inference/v1/batch.proto

# Real chat templates of other model families (tests only), from the llama.cpp tree vendored in the
# pinned llama-cpp-python sdist (PyPI); never committed.
templates:
	PYTHON=$(PYTHON) bash scripts/fetch_chat_templates.sh

model: $(DEFAULT_MODEL)
$(DEFAULT_MODEL):
	$(PYTHON) scripts/fetch_model.py default --dest models

bench-model: $(BENCH_MODEL)
$(BENCH_MODEL):
	$(PYTHON) scripts/fetch_model.py bench --dest models

# llama.cpp's own llama-server, llama-batched-bench and llama-quantize, built once from the llama.cpp
# vendored in the pinned llama-cpp-python sdist (from PyPI) into $(LLAMA_TOOLS)/bin.
llama-tools:
	PYTHON=$(PYTHON) LLAMA_TOOLS_DIR=$(CURDIR)/$(LLAMA_TOOLS) bash scripts/build_llama_tools.sh

# A 1.1B-class benchmark model (TinyLlama's shape, seeded random weights, the default model's
# tokenizer), written with the gguf package and quantized to Q4_K_M; checked against a pinned sha256.
bench-model-1b: $(BENCH_MODEL_1B)
$(BENCH_MODEL_1B):
	$(MAKE) setup llama-tools
	$(PY) scripts/make_bench_model_1b.py --dest models --quantize $(LLAMA_TOOLS)/bin/llama-quantize

serve: setup
	$(PY) -m service --model $(DEFAULT_MODEL) $(ARGS)

test: setup
	$(PY) -m pytest -q $(ARGS)

# No model file needed (nor fetched): tests marked `model` or `vocab` are deselected; the rest read at
# most the tiny vocabulary tests/support/tiny_vocab.py builds. tests/conftest.py fails an unmarked test
# that loads the model.
unit: $(STAMP) stubs templates
	$(PY) -m pytest -q -m "not model and not vocab" $(ARGS)

lint: setup
	$(VENV)/bin/ruff check service clients/python/inference_client tests bench scripts
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	bash scripts/buf.sh lint

# docs/configuration.md is generated from service/config.py's HELP; tests/unit/test_configuration_doc.py
# fails when it is stale.
docs: $(STAMP)
	$(PY) scripts/config_doc.py

# The bench environment adds llama-cpp-python's own server (the peer we compare against).
bench-env: setup
	$(PIP) install -q -r bench/requirements-bench.txt
	$(PIP) install -q --no-deps -r requirements-semantic.txt  # scenario K's semantic half

# Scenario S (goodput) drives the servers with guidellm, in a venv of its own so that its dependencies
# (torch, transformers, datasets) never enter the project's .venv. torch is the CPU build (pinned).
GOODPUT_VENV := .venv-guidellm
goodput-env: $(GOODPUT_VENV)/.stamp
$(GOODPUT_VENV)/.stamp: bench/requirements-goodput.txt
	test -x $(GOODPUT_VENV)/bin/python || $(PYTHON) -m venv $(GOODPUT_VENV)
	$(GOODPUT_VENV)/bin/python -m pip install -q -r bench/requirements-goodput.txt
	$(GOODPUT_VENV)/bin/guidellm --help >/dev/null
	touch $@

bench: bench-env bench-model
	$(PY) -m bench.run $(ARGS)

# A benchmark, not a test: mixed load on the default model (bench/soak/), results in bench/results/soak.json.
soak: bench-env
	$(PY) -m bench.soak $(ARGS)

# Optional extra: the semantic response cache's embedding model (see requirements-semantic.txt for --no-deps).
semantic: setup
	$(PIP) install -q --no-deps -r requirements-semantic.txt

polyglot: setup
	bash clients/polyglot.sh

# PostgreSQL 15 for the shared batch store's tests (tests/support/pg.py starts a throwaway cluster; installs
# Debian's postgresql-15 when missing, as root).
postgres:
	bash scripts/ensure_postgres.sh

# iproute2 for the replica tests (tests/support/netns.py: one network namespace per server; root).
netns:
	bash scripts/ensure_netns.sh

# kubectl for the gateway manifests' tests (tests/unit/deploy: `kubectl kustomize`) and scripts/check_k8s.sh.
kubectl:
	bash scripts/ensure_kubectl.sh

clean:
	rm -rf $(VENV) clients/python/inference build *.egg-info
