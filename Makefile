# ingero: `make demo` runs the GPU-less demo, `make test` runs the tests.
# Both prepare the machine first (Debian packages, kernel headers for bcc, the venv); as root.

VENV   ?= $(CURDIR)/.venv
PYTHON := $(VENV)/bin/python

.PHONY: setup sim demo test bench install lint-man constraints clean

setup:
	@bash scripts/setup-debian.sh
	$(MAKE) -C sim

# The GPU-less cluster: the sim's libcudart/libcuda/libnccl, rank driver and CPU hog.
sim:
	$(MAKE) -C sim

demo: setup
	$(PYTHON) -m ingero demo

test: setup
	$(PYTHON) -m pytest -ra $(PYTEST_ARGS)

# Every benchmark at full size (tens of minutes), then docs/benchmarks.md and the README's
# figures from the results; BENCH_ARGS="--only quality", "--docs-only" or "--smoke --out DIR".
bench: setup
	$(PYTHON) -m bench.all $(BENCH_ARGS)

# The wheel into /opt/ingero/venv, the units, the Slurm hooks and the man pages (ROOT=DIR for a
# staging tree). The Ansible roles in ansible/ do the same across a cluster.
install:
	@bash scripts/install.sh

lint-man:
	mandoc -T lint -W warning man/*.[1-8]

# constraints.txt: the versions of every package of the venv the tests passed in.
constraints:
	@{ sed -n '1,3p' constraints.txt; $(PYTHON) -m pip freeze --local --exclude-editable; } \
		> constraints.txt.new && mv constraints.txt.new constraints.txt

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
