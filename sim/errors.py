"""Errors raised by the sim package.

    SimError
     ├── BuildError      the C half (libraries, rank driver) could not be built
     ├── ScenarioError   a scenario file is malformed; the message names the field
     └── LaunchError     a cluster could not be started (missing binary, no root for netns …)
"""


class SimError(Exception):
    """Base of every error the sim raises."""


class BuildError(SimError):
    """`make -C sim` failed or its outputs are missing."""


class ScenarioError(SimError):
    """A scenario does not validate; str(error) says where and why."""


class LaunchError(SimError):
    """Starting the ranks, the coordinator or the namespaces failed."""
