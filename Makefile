# Two entry points: `make run` (install + the operator app; the headless demo without a display) and
# `make test` (install dev deps + the whole suite).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
SYSTEM_PACKAGES := libosmesa6 libegl1 libgl1 libegl-mesa0 libgles2 xvfb xauth libxcb-cursor0 libxkbcommon-x11-0 libxcb-icccm4 libxcb-image0 libxcb-keysyms1 libxcb-render-util0 libxcb-xinerama0 libxcb-shape0
export MUJOCO_GL ?= egl
export PYOPENGL_PLATFORM ?= egl

.PHONY: run test install install-dev system-deps clean

run: install
	$(VENV)/bin/hg-dagger app

test: install-dev
	QT_QPA_PLATFORM=offscreen SDL_VIDEODRIVER=dummy SDL_AUDIODRIVER=dummy $(PY) -m pytest

system-deps:
	@if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
		missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
		if [ -n "$$missing" ]; then echo "installing system packages:$$missing"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi; \
	else echo "not root: make sure these system packages are installed: $(SYSTEM_PACKAGES)"; fi

$(VENV)/.installed: pyproject.toml setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# The CPU build of torch first, so nothing pulls a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) install -q -e ".[dev]"
	# EmbodiChain's CPU-importable parts (learning.rl, data_pipeline) for the LearningVecEnv tests.
	# --no-deps: its simulator dexsim_engine is served only by DexForce's own index.
	$(PIP) install -q --no-deps embodichain==0.3.2
	touch $@

install: system-deps $(VENV)/.installed
install-dev: system-deps $(VENV)/.installed-dev

clean:
	rm -rf $(VENV) build *.egg-info
