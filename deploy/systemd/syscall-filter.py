#!/usr/bin/env python3
"""Runs a command under a unit file's SystemCallFilter=, built the way systemd builds it.

    syscall-filter.py UNIT -- COMMAND [ARGS...]

For testing the unit where systemd is not PID 1 (agent/tests/deploy.rs): the allow list is
the first SystemCallFilter= line, the `~` lines are removed from it, groups (`@name`) are
expanded with `systemd-analyze syscall-filter` (this systemd's own definitions), every other
system call fails with SystemCallErrorNumber= (EPERM when unset), native architecture only
(SystemCallArchitectures=native). The filter is loaded with libseccomp (PyPI `pyseccomp`,
ctypes over the system's libseccomp.so.2), then COMMAND is executed. The process must
already have no_new_privs set (setpriv --no-new-privs), as NoNewPrivileges=yes does.
"""

import errno
import os
import subprocess
import sys

import pyseccomp as seccomp


def groups():
    """Every group of `systemd-analyze syscall-filter`: name -> members (names or @groups)."""
    out = subprocess.run(
        ["systemd-analyze", "syscall-filter", "--no-pager"],
        check=True, capture_output=True, text=True,
    ).stdout
    table, current = {}, None
    for line in out.splitlines():
        if line.startswith("@"):
            current = line.strip()
            table[current] = []
        elif current and line.strip() and not line.strip().startswith("#"):
            table[current].append(line.strip())
    return table


def expand(items, table, seen=None):
    seen = set() if seen is None else seen
    out = set()
    for item in items:
        if item.startswith("@"):
            if item in seen:
                continue
            seen.add(item)
            if item not in table:
                sys.exit(f"syscall-filter.py: unknown group {item}")
            out |= expand(table[item], table, seen)
        else:
            out.add(item)
    return out


def unit_filter(path):
    allow, deny, errno_name = None, set(), "EPERM"
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("SystemCallFilter="):
                value = line.split("=", 1)[1].split()
                if value and value[0].startswith("~"):
                    deny |= {value[0][1:], *value[1:]}
                elif allow is None:
                    allow = set(value)
                else:
                    allow |= set(value)
            elif line.startswith("SystemCallErrorNumber="):
                errno_name = line.split("=", 1)[1].strip()
    if allow is None:
        sys.exit(f"syscall-filter.py: no allow-list SystemCallFilter= in {path}")
    return allow, deny, getattr(errno, errno_name)


def main(argv):
    if len(argv) < 3 or argv[1] != "--":
        sys.exit(__doc__)
    allow, deny, err = unit_filter(argv[0])
    table = groups()
    allowed = expand(allow, table) - expand(deny, table)
    f = seccomp.SyscallFilter(defaction=seccomp.ERRNO(err))
    added = 0
    for name in sorted(allowed):
        try:
            f.add_rule(seccomp.ALLOW, name)
            added += 1
        except Exception:
            pass  # not a system call on this architecture
    f.load()
    print(f"syscall-filter.py: {added} system calls allowed, others fail with "
          f"{errno.errorcode[err]}", file=sys.stderr)
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
