# make demo   : set up .venv (torch CPU, diffaccel, every plugin) and run the default models
# make test   : same set-up, then every test suite (core and plugins)
# make test-plugin PLUGIN=topk : one plugin's tests
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PLUGIN_DIRS := $(patsubst %/pyproject.toml,%,$(wildcard plugins/*/pyproject.toml))
export HF_HUB_OFFLINE := 1

.PHONY: setup demo test test-core test-plugin bench-overhead bench-partial fluency clean

$(VENV)/.installed: pyproject.toml $(addsuffix /pyproject.toml,$(PLUGIN_DIRS))
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip "setuptools>=77" wheel
	# torch==2.13.0 is the CPU wheel on this disk; a bare "torch" pulls a multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q --no-build-isolation -e ".[test]"
	for p in $(PLUGIN_DIRS); do $(BIN)/pip install -q --no-deps --no-build-isolation -e $$p || exit 1; done
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(BIN)/diffaccel plugins
	$(BIN)/diffaccel generate configs/text-default.toml
	$(BIN)/diffaccel generate configs/text-continuous.toml

test: setup
	$(BIN)/python -m pytest tests $(addsuffix /tests,$(PLUGIN_DIRS)) -q

test-core: setup
	$(BIN)/python -m pytest tests -q

test-plugin: setup
	$(BIN)/python -m pytest plugins/$(PLUGIN)/tests -q

bench-overhead: setup
	$(BIN)/diffaccel overhead configs/text-default.toml

bench-partial: setup
	$(BIN)/diffaccel partial configs/text-default.toml

fluency: setup
	$(BIN)/diffaccel fluency configs/text-default.toml

clean:
	rm -rf $(VENV) build *.egg-info core/*.egg-info plugins/*/*.egg-info
