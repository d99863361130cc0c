"""Whether this Python's ingero is the build in the wheel named on the command line.

Exit 0 when every file the wheel's RECORD lists is installed with the hash it has there; 1 when
one differs or ingero is not installed. pip keeps an installed version when given a wheel of
the same version: this tells a new build of it (the checkout changed, its version did not).
"""

import sys
import zipfile
from importlib import metadata


def wheel_hashes(wheel: str) -> dict[str, str]:
    """path → 'sha256=…' of each file in the wheel, from its RECORD."""
    with zipfile.ZipFile(wheel) as archive:
        record = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
        rows = [line.split(",") for line in archive.read(record).decode().splitlines()]
    return {row[0]: row[1] for row in rows if len(row) == 3 and row[1]}


def installed_hashes(name: str) -> dict[str, str]:
    try:
        files = metadata.distribution(name).files or []
    except metadata.PackageNotFoundError:
        return {}
    return {str(f): f"{f.hash.mode}={f.hash.value}" for f in files if f.hash}


if __name__ == "__main__":
    wanted = wheel_hashes(sys.argv[1])
    installed = installed_hashes("ingero")
    sys.exit(0 if all(installed.get(path) == digest for path, digest in wanted.items()) else 1)
