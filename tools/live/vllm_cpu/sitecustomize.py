"""Start-up fix for vLLM's CPU build on an Intel CPU with AMX, loaded by Python from PYTHONPATH.

Linux lets a process run AMX tile instructions only after it asked for the tile state
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``, Linux 5.16 on); without it the first
one is SIGILL. oneDNN asks before its own AMX kernels, vLLM's CPU attention kernel
(``cpu_attention_with_kv_cache``) does not: a server whose first request takes that kernel's AMX
path before any oneDNN matmul ran (seen: a first prompt of three tokens) loses its worker to an
illegal instruction. Every Python process of the server asks here, at start-up, for what oneDNN
would have asked for anyway; on a CPU without AMX the request fails harmlessly and nothing
changes.
"""

from __future__ import annotations

import ctypes
import platform

if platform.machine() == "x86_64":
    _SYS_ARCH_PRCTL = 158
    _ARCH_REQ_XCOMP_PERM = 0x1023
    _XFEATURE_XTILEDATA = 18
    ctypes.CDLL(None, use_errno=True).syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)
