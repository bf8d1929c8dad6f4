"""Which collected tests have no result in a JUnit XML report (a pytest run cut off by its time limit):

    python3 tools/tests_not_run.py report.xml collected.txt

collected.txt holds node ids, one per line (`pytest --collect-only -q`); prints those not in the report.
"""

from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ET


def node_id(classname: str, name: str) -> str:
    """JUnit's (classname, name) of a module-level test back to its node id."""
    return classname.replace(".", "/") + ".py::" + name


def main(report: str, collected: str) -> None:
    if not os.path.exists(report):
        print(f"no JUnit report at {report}: pytest wrote none")
        return
    ran = {node_id(c.get("classname", ""), c.get("name", "")) for c in ET.parse(report).iter("testcase")}
    with open(collected) as f:
        wanted = [line.strip() for line in f if "::" in line]
    missing = [n for n in wanted if n not in ran]
    print(f"{len(wanted) - len(missing)} of {len(wanted)} collected tests reported; not run:")
    print("\n".join(missing))


if __name__ == "__main__":
    main(*sys.argv[1:3])
