# Two entry points: `make run` (install + the operator app; the headless demo without a display) and
# `make test` (install dev deps + the whole suite); `make test-interop`: LeRobot's loader reads our export.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
SYSTEM_PACKAGES := libosmesa6 libegl1 libgl1 libegl-mesa0 libgles2 xvfb xauth libxcb-cursor0 libxkbcommon-x11-0 libxcb-icccm4 libxcb-image0 libxcb-keysyms1 libxcb-render-util0 libxcb-xinerama0 libxcb-shape0
export MUJOCO_GL ?= egl
export PYOPENGL_PLATFORM ?= egl

.PHONY: run test test-fast test-fuzz test-interop install install-dev system-deps clean

run: install
	$(VENV)/bin/hg-dagger app

# The suite runs in two pytest-xdist workers, one per core (docs/decisions.md). Tests marked own_process (the Ray
# worker-kill tests) run in a further pytest process of their own: after the rest of the suite in one process, the
# auto kill test missed the open episode in 3 of 4 runs.
TEST_WORKERS ?= 2
test: install-dev
	QT_QPA_PLATFORM=offscreen SDL_VIDEODRIVER=dummy SDL_AUDIODRIVER=dummy $(PY) -m pytest -n $(TEST_WORKERS) -m "not own_process"
	QT_QPA_PLATFORM=offscreen SDL_VIDEODRIVER=dummy SDL_AUDIODRIVER=dummy $(PY) -m pytest -m own_process

# The unit tier: no MuJoCo physics, no child processes, no Ray, no Qt (markers in pyproject.toml).
test-fast: install-dev
	QT_QPA_PLATFORM=offscreen SDL_VIDEODRIVER=dummy SDL_AUDIODRIVER=dummy $(PY) -m pytest -q \
		-m "not (simulation or subprocess or ray or app or slow)"

# The hypothesis properties with a long random search (thousands of examples each, no per-test time limit); `make
# test` runs each with a small fixed example sequence (tests/support/fuzz.py, docs/decisions.md).
FUZZ_EXAMPLES ?= 2000
test-fuzz: install-dev
	HG_DAGGER_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) QT_QPA_PLATFORM=offscreen SDL_VIDEODRIVER=dummy SDL_AUDIODRIVER=dummy \
		$(PY) -m pytest -n $(TEST_WORKERS) -q --timeout=0 -p no:cacheprovider $$(grep -rl "@given" tests)

# LeRobot's own loader and `lerobot-train` (ACT, diffusion) read `hg-dagger export --format lerobot` (PNG frames and
# H.264 video), LeRobot's v2.1 reader opens the RLinf shard, EmbodiChain's LeRobotDataSource reads the export, and a
# policy that lerobot-train trained is served by `hg-dagger policy serve lerobot:DIR` to `hg-dagger run`
# (tests/interop). lerobot 0.4.4 (the newest for Python 3.11) needs torchvision, whose wheels here pair with torch
# 2.14.1, not the project's CPU torch 2.13, so it lives in an environment of its own, built once (about 6 GB; torch
# 2.14.1 and torchvision 0.29.1 come from the local wheel mirror). --no-deps: lerobot's declared torch < 2.11 would
# pull a different torch; the packages below are what its dataset module, `lerobot.policies` (diffusers) and
# training import, at the versions these tests were run with. Video: torchvision 0.29 has no VideoReader and
# lerobot's own torchcodec pin (< 0.11) does not fit torch 2.14.1, so torchcodec 0.17.0 (built for torch >= 2.11,
# CUDA 13 like this torch), which loads the system's FFmpeg shared libraries: Debian 12's FFmpeg 5.1 below.
# embodichain --no-deps as in the dev environment (its data pipeline needs tensordict and scipy). hg-dagger itself
# goes in editable with --no-deps and its core dependencies (no Qt, no simulators), for `policy serve`.
INTEROP_VENV ?= .venv-interop
# openpi's own client package pins numpy < 2: a small environment of its own talks to `hg-dagger policy serve`
# (tests/interop/test_openpi_client.py). typing_extensions: the client imports it without declaring it.
OPENPI_VENV ?= .venv-openpi
INTEROP_PY := $(INTEROP_VENV)/bin/python
INTEROP_PACKAGES := datasets==5.2.0 huggingface-hub==2.4.0 accelerate==1.15.0 av==15.1.0 \
	opencv-python-headless==5.0.0.93 jsonlines==4.0.0 packaging==26.4 draccus==0.10.0 gymnasium==1.4.0 \
	deepdiff==9.1.0 imageio==2.38.1 termcolor==3.3.0 einops==0.8.2 pyserial==3.5 pandas==3.1.1 pyarrow==26.0.1 \
	diffusers==0.35.2 tensordict==0.15.3 scipy==1.17.1 pytest==9.2.0 pytest-timeout==2.4.0 torchcodec==0.17.0
INTEROP_CORE_PACKAGES := zarr==3.1.6 numcodecs==0.16.6 google-crc32c==1.9.0 pydantic==2.14.4 msgpack==1.2.4 \
	websockets==15.0.1
INTEROP_SYSTEM_PACKAGES := libavcodec59 libavformat59 libavutil57 libavdevice59 libavfilter8 libswscale6 libswresample4

test-interop: install-dev $(INTEROP_VENV)/.installed $(OPENPI_VENV)/.installed
	QT_QPA_PLATFORM=offscreen HG_DAGGER_PYTHON=$(abspath $(PY)) OPENPI_PYTHON=$(abspath $(OPENPI_VENV))/bin/python \
		$(INTEROP_PY) -m pytest -q -s -p no:cacheprovider tests/interop

$(OPENPI_VENV)/.installed: Makefile
	@test -x $(OPENPI_VENV)/bin/python || $(PYTHON) -m venv $(OPENPI_VENV)
	$(OPENPI_VENV)/bin/python -m pip install -q openpi-client==0.1.2 typing_extensions
	touch $@

$(INTEROP_VENV)/.installed: Makefile
	@if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
		missing=""; for p in $(INTEROP_SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
		if [ -n "$$missing" ]; then echo "installing system packages:$$missing"; apt-get update -qq && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; fi; \
	else echo "not root: video decoding needs FFmpeg's shared libraries ($(INTEROP_SYSTEM_PACKAGES) on Debian 12)"; fi
	@test -x $(INTEROP_PY) || $(PYTHON) -m venv $(INTEROP_VENV)
	$(INTEROP_PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(INTEROP_PY) -m pip install -q --no-deps lerobot==0.4.4
	$(INTEROP_PY) -m pip install -q $(INTEROP_PACKAGES) $(INTEROP_CORE_PACKAGES)
	$(INTEROP_PY) -m pip install -q --no-deps embodichain==0.3.2
	$(INTEROP_PY) -m pip install -q --no-deps -e .
	touch $@

system-deps:
	@if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
		missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
		if [ -n "$$missing" ]; then echo "installing system packages:$$missing"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi; \
	else echo "not root: make sure these system packages are installed: $(SYSTEM_PACKAGES)"; fi

# The app's extras (console, devices, simulators, export) with the exact versions of constraints.txt; the core alone
# (`pip install hg-dagger`) is what a robot PC needs (docs/install.md).
$(VENV)/.installed: pyproject.toml setup.py constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# The CPU build of torch first, so nothing pulls a multi-GB CUDA build.
	$(PIP) install -q -c constraints.txt torch
	$(PIP) install -q -c constraints.txt -e ".[app,sim,export]"
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) install -q -c constraints.txt -e ".[dev]"
	# EmbodiChain's CPU-importable parts (learning.rl, data_pipeline) for the LearningVecEnv tests.
	# --no-deps: its simulator dexsim_engine is served only by DexForce's own index.
	$(PIP) install -q --no-deps embodichain==0.3.2
	touch $@

install: system-deps $(VENV)/.installed
install-dev: system-deps $(VENV)/.installed-dev

clean:
	rm -rf $(VENV) $(INTEROP_VENV) build *.egg-info
